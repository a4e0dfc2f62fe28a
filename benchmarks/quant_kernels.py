"""The NVFP4 and MXFP4 quantize kernels against the HBM floor on the present GPU (scripts/bench_quant.py).

For each kernel (1x16 rows, 2D 16x16, 16x1 columns along tokens, columns with RHT, and their
stochastic-rounding variants) and for the plain-torch reference (eager and torch.compile), it times
the whole quantize call (amax pass + quantize pass) two ways with CUDA events (benchmarks.timing):
- "graphed": the GPU time of the call, replayed from a CUDA graph holding GRAPH_CALLS calls (as
  compiled training with ``parallel.cuda_graph`` runs them). The target ("of copy bw") is read
  from this one: (bytes read once + bytes written) / the device-to-device copy bandwidth measured
  in the same run, over the measured time (1.0 = as fast as a copy moving those bytes);
- "eager": calls launched from Python, where the host's launch overhead (~20 us per Triton
  launch) shows whenever it exceeds the GPU time.
The kernels run with a few launch configurations, each a variant of the default options object
(``dataclasses.replace(NVFP4_OPTIONS, ...)``, the default listed first); the best one per kernel
(graphed) is marked with *. Rows also time the amax passes alone (against a read of x), the RHT
kernels' two bf16 roundings, and an operand's two orientations with one shared amax pass against
two; the NVFP4 variants (Four Over Six by MSE, UE5M3 block scales) and the MXFP4 kernels (kernels.mx)
at their default launches. Before timing, each RNE kernel
is checked bit for bit against its torch reference on the benchmark tensor.
"""

from __future__ import annotations

import dataclasses

import torch

from benchmarks.timing import cuda_median_ms
from models.quant import kernels
from models.quant.kernels import mx, nvfp4, nvfp4_amax
from models.quant.kernels.nvfp4 import quantize_columns_ref, quantize_rows_ref
from models.quant.kernels.options import NVFP4_OPTIONS, Nvfp4Options

DEFAULT = NVFP4_OPTIONS


def _with_default_first(default, others):
    return [default] + [other for other in others if other != default]


# (tile rows, tile cols, num_warps) and (groups of 16 rows, cols, num_warps); the default first.
ROWS_CONFIGS = _with_default_first(DEFAULT.rows, [(16, 128, 4), (16, 256, 8), (32, 128, 8), (16, 64, 2), (8, 256, 4),
                                                  (32, 256, 8), (64, 128, 8), (32, 128, 4)])
TWO_D_CONFIGS = _with_default_first(DEFAULT.two_d, [c for c in ROWS_CONFIGS if c[0] == 16])
COLUMNS_CONFIGS = _with_default_first(DEFAULT.columns, [(1, 128, 4), (2, 256, 8), (2, 128, 8), (1, 256, 8), (2, 64, 4),
                                                        (4, 64, 8), (1, 64, 2), (2, 128, 4)])
COLUMNS_STOCHASTIC_CONFIGS = _with_default_first(DEFAULT.columns_stochastic, COLUMNS_CONFIGS)
AMAX_CHUNKS = _with_default_first(DEFAULT.amax_chunk, [(2048, 4, 4), (1024, 8, 4), (8192, 2, 8)])
# ((groups of 16 rows, cols, num_warps), programs per SM) of the persistent RHT amax kernel.
RHT_AMAX_VARIANTS = _with_default_first((DEFAULT.rht_amax, DEFAULT.amax_programs_per_sm), [
    ((2, 128, 4), 4), ((2, 128, 4), 8), ((4, 128, 4), 4), ((4, 128, 8), 4), ((2, 256, 8), 4), ((8, 128, 8), 2)])
RHT_PLAIN_AMAX_CONFIGS = [(4, 128, 4), (4, 64, 4), (2, 128, 4), (8, 64, 8), (2, 64, 2)]  # the bf16 and fp32 defaults first
GRAPH_CALLS = 4


def variant(**changes) -> Nvfp4Options:
    """The default options with ``changes`` (a launch or a switch to time)."""
    return dataclasses.replace(DEFAULT, **changes)


def time_ms(fn, *, iterations: int, warmup: int) -> float:
    """Median milliseconds of fn over `iterations` CUDA-event-timed calls after `warmup` calls."""
    return cuda_median_ms(fn, warmup, iterations)


def graphed_ms(fn, *, iterations: int, warmup: int) -> float:
    """GPU milliseconds of one call of fn: GRAPH_CALLS calls captured in a CUDA graph (after warm-up
    calls on a side stream, as torch.cuda.graphs asks), the replay timed, divided by GRAPH_CALLS."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    return cuda_median_ms(graph.replay, warmup, iterations) / GRAPH_CALLS


def copy_bandwidth(x: torch.Tensor, iterations: int, warmup: int) -> float:
    """Bytes per second of a device-to-device copy of x (read + write counted), GPU time."""
    destination = torch.empty_like(x)
    milliseconds = graphed_ms(lambda: destination.copy_(x), iterations=iterations, warmup=warmup)
    return 2 * x.numel() * x.element_size() / (milliseconds * 1e-3)


def floor_bytes(x: torch.Tensor, *, values_bytes: int) -> int:
    """Read x once, write the scaled values and one E4M3 scale per 16 elements."""
    return x.numel() * x.element_size() + x.numel() * values_bytes + x.numel() // 16


def check_identical(out, reference, transposed: bool) -> bool:
    values = out.values.t() if transposed else out.values
    scales = out.block_scales.view(torch.uint8)
    scales = scales.t() if transposed else scales
    expected_values = reference.scaled_values(out.values.dtype)
    same_values = torch.equal(values, expected_values)
    expected_scales = (reference.block_scales.view(torch.uint8) if reference.block_scales.dtype != torch.float32
                       else nvfp4.block_scale_codes(reference))  # UE5M3 scales: the reference holds fp32 values
    same_scales = torch.equal(scales, expected_scales)
    if not hasattr(out, "decode_scale"):  # MXFP4: no per-tensor scale
        return bool(same_values and same_scales)
    same_decode = torch.equal(out.decode_scale.reshape(()), reference.tensor_scale)
    return bool(same_values and same_scales and same_decode)


def bench_quantize(rows_count: int = 8192, cols: int = 5120, dtype_name: str = "bf16", iterations: int = 50,
                   warmup: int = 10, compile_reference: bool = True) -> dict:
    """Time every kernel variant and launch configuration on a random [rows_count, cols] tensor.

    Returns {'rows': one dict per (kernel, config), 'copy_bandwidth_bytes_per_s', 'floor_ms'}; each row says
    whether it is the fastest of its kernel ('best_for_kernel', graphed time).
    """
    kernels.use_triton(True)
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    torch.manual_seed(0)
    x = torch.randn(rows_count, cols, device="cuda", dtype=dtype)
    seed = torch.tensor([1], dtype=torch.int64, device="cuda")  # a tensor: capturable in a graph
    bandwidth = copy_bandwidth(x, iterations, warmup)
    values_bytes = 2  # bf16 scaled values
    floor_ms = floor_bytes(x, values_bytes=values_bytes) / bandwidth * 1e3
    read_floor_ms = x.numel() * x.element_size() / bandwidth * 1e3
    timing = dict(iterations=iterations, warmup=warmup)
    rows = []

    def measure(name, run, *, config=None, identical=None, floor=floor_ms):
        """Time run() eager and graphed; a launch shape that does not compile, or a call that cannot be
        captured, is reported, not fatal (an eager time survives a failed capture)."""
        eager = graphed = error = None
        try:
            eager = time_ms(run, **timing)
            graphed = graphed_ms(run, **timing)
        except Exception as caught:
            error = f"{type(caught).__name__}: {caught}"
        print(f"  {name} {config}: eager {eager} ms, graphed {graphed} ms, identical {identical}", flush=True)
        rows.append({
            "name": name, "config": config, "eager_ms": eager, "ms": graphed, "floor_ms": floor,
            "fraction_of_copy_bw": (floor / graphed) if graphed else None, "bit_identical": identical,
            "error": error,
        })

    # --- Triton kernels ------------------------------------------------------------------------
    reference_rows = quantize_rows_ref(x)
    reference_2d = quantize_rows_ref(x, two_d=True)
    reference_columns = quantize_columns_ref(x)
    reference_columns_rht = quantize_columns_ref(x, rht=True)
    variants = [  # (name, launches, run(options), RNE reference or None, outputs transposed)
        ("rows 1x16 RNE", [variant(rows=c, rows_narrow=c) for c in ROWS_CONFIGS],
         lambda o: nvfp4.quantize_rows(x, options=o), reference_rows, False),
        ("rows 1x16 SR", [variant(rows=c, rows_narrow=c) for c in ROWS_CONFIGS],
         lambda o: nvfp4.quantize_rows(x, stochastic=True, seed=seed, options=o), None, False),
        ("2D 16x16 RNE", [variant(two_d=c) for c in TWO_D_CONFIGS],
         lambda o: nvfp4.quantize_rows(x, two_d=True, options=o), reference_2d, False),
        ("columns 16x1 RNE", [variant(columns=c) for c in COLUMNS_CONFIGS],
         lambda o: nvfp4.quantize_columns(x, options=o), reference_columns, True),
        ("columns 16x1 RHT RNE", [variant(columns=c) for c in COLUMNS_CONFIGS],
         lambda o: nvfp4.quantize_columns(x, rht=True, options=o), reference_columns_rht, True),
        ("columns 16x1 RHT SR", [variant(columns_stochastic=c) for c in COLUMNS_STOCHASTIC_CONFIGS],
         lambda o: nvfp4.quantize_columns(x, rht=True, stochastic=True, seed=seed, options=o), None, True),
    ]
    launch_of = {"rows 1x16 RNE": "rows", "rows 1x16 SR": "rows", "2D 16x16 RNE": "two_d",
                 "columns 16x1 RNE": "columns", "columns 16x1 RHT RNE": "columns",
                 "columns 16x1 RHT SR": "columns_stochastic"}
    for name, options_list, run, reference, transposed in variants:
        for options in options_list:
            config = getattr(options, launch_of[name])
            try:
                identical = check_identical(run(options), reference, transposed) if reference is not None else None
            except Exception:
                identical = None  # measure() reports the error
            measure(name, lambda: run(options), config=list(config), identical=identical)

    # --- the RHT kernels' bf16 rounding: the conversion (default) against integer ops ---------------
    integer = variant(bf16_rounding="integer")
    measure("columns 16x1 RHT RNE, bf16 rounding by integer ops",
            lambda: nvfp4.quantize_columns(x, rht=True, options=integer),
            identical=check_identical(nvfp4.quantize_columns(x, rht=True, options=integer), reference_columns_rht, True))
    measure("columns 16x1 RHT SR, bf16 rounding by integer ops",
            lambda: nvfp4.quantize_columns(x, rht=True, stochastic=True, seed=seed, options=integer))

    # The amax passes alone; their floor is a read of x.
    for chunk in AMAX_CHUNKS:
        measure("amax pass only (read floor)", lambda: nvfp4_amax.tensor_amax(x, options=variant(amax_chunk=chunk)),
                config=list(chunk), floor=read_floor_ms)
    for rht_config, programs_per_sm in RHT_AMAX_VARIANTS:
        options = variant(rht_amax=rht_config, amax_programs_per_sm=programs_per_sm)
        measure("amax pass with RHT + finalize (read floor)", lambda: nvfp4_amax.rht_global_scales(x, options=options),
                config=[*rht_config, programs_per_sm], floor=read_floor_ms)

    # X and dY are each quantized in both orientations (X: Fprop rows RNE, Wgrad columns RHT RNE; dY:
    # Dgrad rows SR, Wgrad columns RHT SR): the pair with an amax pass each, against one pass that
    # gives both global scales (nvfp4_amax.rows_and_rht_columns_scales, as models.quant.linear runs it).
    def pair(stochastic, shared):
        scales = nvfp4_amax.rows_and_rht_columns_scales(x) if shared else None
        rows_out = nvfp4.quantize_rows(x, stochastic=stochastic, seed=seed, amax=None if scales is None else scales[2:])
        columns_out = nvfp4.quantize_columns(x, rht=True, stochastic=stochastic, seed=seed, global_scales=scales)
        return rows_out, columns_out

    def pair_identical(stochastic):
        shared, separate = pair(stochastic, True), pair(stochastic, False)
        if stochastic:  # the same seed and scales draw the same roundings
            return all(torch.equal(a.values, b.values) and torch.equal(a.decode_scale, b.decode_scale)
                       for a, b in zip(shared, separate))
        return (check_identical(shared[0], reference_rows, False)
                and check_identical(shared[1], reference_columns_rht, True))

    for label, stochastic in (("X: rows RNE + columns RHT RNE", False), ("dY: rows SR + columns RHT SR", True)):
        measure(f"{label}, two amax passes", lambda: pair(stochastic, False), floor=2 * floor_ms)
        measure(f"{label}, one shared pass", lambda: pair(stochastic, True), identical=pair_identical(stochastic),
                floor=2 * floor_ms)
    for plain_config in RHT_PLAIN_AMAX_CONFIGS:
        options = variant(rht_plain_amax=plain_config, rht_plain_amax_fp32=plain_config)
        measure("max|x| + RHT amax + finalize (read floor)",
                lambda: nvfp4_amax.rows_and_rht_columns_scales(x, options=options), config=list(plain_config),
                floor=read_floor_ms)

    # --- NVFP4 variants (default launches): Four Over Six (MSE) and UE5M3 block scales, the study's arms ---
    for label, keywords in (("4/6", dict(four_over_six="mse")), ("UE5M3", dict(fmt="nvfp4_ue5m3"))):
        for name, run, reference, transposed in [
            ("rows 1x16 RNE", lambda kw=keywords: nvfp4.quantize_rows(x, **kw),
             lambda kw=keywords: quantize_rows_ref(x, **kw), False),
            ("2D 16x16 RNE", lambda kw=keywords: nvfp4.quantize_rows(x, two_d=True, **kw),
             lambda kw=keywords: quantize_rows_ref(x, two_d=True, **kw), False),
            ("columns 16x1 RHT RNE", lambda kw=keywords: nvfp4.quantize_columns(x, rht=True, **kw),
             lambda kw=keywords: quantize_columns_ref(x, rht=True, **kw), True),
            ("columns 16x1 RHT SR", lambda kw=keywords: nvfp4.quantize_columns(x, rht=True, stochastic=True, seed=seed,
                                                                                **kw), None, True),
        ]:
            identical = check_identical(run(), reference(), transposed) if reference is not None else None
            measure(f"{label} {name}", run, identical=identical)

    # --- MXFP4 (kernels.mx, default launches): one launch per call, no amax pass ------------------
    if rows_count % 32 == 0 and cols % 32 == 0:  # MX blocks are 32 long, both ways
        mx_rows, mx_columns_rht = mx.quantize_rows_ref(x), mx.quantize_columns_ref(x, rht=True)
        mx_floor_ms = (x.numel() * x.element_size() + x.numel() * values_bytes + x.numel() // 32) / bandwidth * 1e3
        measure("mx rows 1x32 RNE", lambda: mx.quantize_rows(x), identical=check_identical(mx.quantize_rows(x), mx_rows, False),
                floor=mx_floor_ms)
        measure("mx rows 1x32 SR", lambda: mx.quantize_rows(x, stochastic=True, seed=seed), floor=mx_floor_ms)
        measure("mx columns 32x1 RNE (W^T)", lambda: mx.quantize_columns(x),
                identical=check_identical(mx.quantize_columns(x), mx.quantize_columns_ref(x), True), floor=mx_floor_ms)
        measure("mx columns 32x1 RHT RNE", lambda: mx.quantize_columns(x, rht=True),
                identical=check_identical(mx.quantize_columns(x, rht=True), mx_columns_rht, True), floor=mx_floor_ms)
        measure("mx columns 32x1 RHT SR", lambda: mx.quantize_columns(x, rht=True, stochastic=True, seed=seed),
                floor=mx_floor_ms)

    # --- plain torch reference -----------------------------------------------------------------
    def reference_fn(tensor):
        return quantize_rows_ref(tensor).scaled_values(torch.bfloat16)

    eager_reference = time_ms(lambda: reference_fn(x), iterations=10, warmup=2)
    rows.append({"name": "torch reference rows 1x16 (eager)", "config": None, "eager_ms": eager_reference,
                 "ms": None, "floor_ms": floor_ms, "fraction_of_copy_bw": floor_ms / eager_reference,
                 "bit_identical": None, "error": None})
    if compile_reference:
        compiled = torch.compile(reference_fn)
        measure("torch reference rows 1x16 (torch.compile)", lambda: compiled(x))

    # --- report --------------------------------------------------------------------------------
    best = {}
    for row in rows:
        if row["ms"] is not None and (row["name"] not in best or row["ms"] < best[row["name"]]["ms"]):
            best[row["name"]] = row
    for row in rows:
        row["best_for_kernel"] = best.get(row["name"]) is row
    return {"rows": rows, "copy_bandwidth_bytes_per_s": bandwidth, "floor_ms": floor_ms}


def render(rows: list) -> list:
    """The printed table: one line per row (and its error, if any); "of copy bw" from the graphed time
    (the eager one for the eager-only torch reference)."""
    lines = [f"{'kernel':48s} {'config':>10s} {'eager us':>9s} {'graphed us':>10s} {'of copy bw':>10s} "
             f"{'identical':>9s}"]
    for row in rows:
        config = "x".join(map(str, row["config"])) if row["config"] else "-"
        eager = f"{row['eager_ms'] * 1e3:9.1f}" if row["eager_ms"] is not None else f"{'-':>9s}"
        graphed = f"{row['ms'] * 1e3:10.1f}" if row["ms"] is not None else f"{'-':>10s}"
        if row["error"]:
            eager = eager if row["eager_ms"] is not None else f"{'error':>9s}"
            graphed = f"{'error':>10s}"
        fraction = f"{row['fraction_of_copy_bw']:10.1%}" if row["fraction_of_copy_bw"] else f"{'-':>10s}"
        identical = {None: "-", True: "yes", False: "NO"}[row["bit_identical"]]
        marker = " *" if row["best_for_kernel"] else ""
        lines.append(f"{row['name']:48s} {config:>10s} {eager} {graphed} {fraction} {identical:>9s}{marker}")
        if row["error"]:
            lines.append(f"    {row['error'][:300]}")
    return lines
