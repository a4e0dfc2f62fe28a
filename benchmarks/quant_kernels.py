"""The NVFP4 quantize kernels against the HBM floor on the present GPU (scripts/bench_quant.py).


For each kernel (1x16 rows, 2D 16x16, 16x1 columns along tokens, columns with RHT, and their
stochastic-rounding variants) and for the plain-torch reference (eager and torch.compile), it times
the whole quantize call (amax pass + quantize pass) with CUDA events (benchmarks.timing) and compares it with the HBM
floor: (bytes read once + bytes written) / the device-to-device copy bandwidth measured in the
same run. "of copy bw" = floor time / measured time (1.0 = as fast as a copy moving those bytes).
The kernels run with a few launch configurations (the first listed is the module's default); the
best one per kernel is marked with *. The amax pass is also timed alone, against a read of x: torch's
max-abs reduction and the persistent Triton kernel (tile rows, cols, warps, programs per SM). Before timing, each
RNE kernel is checked bit for bit against the torch reference on the benchmark tensor.
"""

from __future__ import annotations

import torch

from benchmarks.timing import cuda_median_ms
from models.quant import kernels
from models.quant.formats import quantize
from models.quant.rht import rht

# (tile rows, tile cols, num_warps) and (groups of 16 rows, cols, num_warps); the first is the default.
ROWS_CONFIGS = [kernels.ROWS_CONFIG, (16, 256, 8), (32, 128, 8), (16, 64, 2), (16, 256, 4), (8, 256, 4),
                (32, 256, 8), (64, 128, 8)]
COLUMNS_CONFIGS = [kernels.COLUMNS_CONFIG, (1, 128, 4), (2, 256, 8), (2, 128, 8), (1, 256, 8), (2, 64, 4),
                   (4, 64, 8), (1, 64, 2)]
AMAX_CONFIGS = [kernels.AMAX_CONFIG, (32, 256, 8), (8, 256, 4)]  # x programs per SM below
AMAX_PROGRAMS_PER_SM = [kernels.AMAX_PROGRAMS_PER_SM, 16]


def time_ms(fn, *, iterations: int, warmup: int) -> float:
    """Median milliseconds of fn over `iterations` CUDA-event-timed calls after `warmup` calls."""
    return cuda_median_ms(fn, warmup, iterations)


def copy_bandwidth(x: torch.Tensor, iterations: int, warmup: int) -> float:
    """Bytes per second of a device-to-device copy of x (read + write counted)."""
    destination = torch.empty_like(x)
    milliseconds = time_ms(lambda: destination.copy_(x), iterations=iterations, warmup=warmup)
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
    same_scales = torch.equal(scales, reference.block_scales.view(torch.uint8))
    same_decode = torch.equal(out.decode_scale.reshape(()), reference.tensor_scale)
    return bool(same_values and same_scales and same_decode)


def bench_quantize(rows_count: int = 8192, cols: int = 5120, dtype_name: str = "bf16", iterations: int = 50,
                   warmup: int = 10, compile_reference: bool = True) -> dict:
    """Time every kernel variant and launch configuration on a random [rows_count, cols] tensor.

    Returns {'rows': one dict per (kernel, config), 'copy_bandwidth_bytes_per_s', 'floor_ms'}; each row says
    whether it is the fastest of its kernel ('best_for_kernel').
    """
    kernels.use_triton(True)
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    torch.manual_seed(0)
    x = torch.randn(rows_count, cols, device="cuda", dtype=dtype)
    bandwidth = copy_bandwidth(x, iterations, warmup)
    values_bytes = 2  # bf16 scaled values
    floor_ms = floor_bytes(x, values_bytes=values_bytes) / bandwidth * 1e3
    timing = dict(iterations=iterations, warmup=warmup)
    rows = []

    def record(name, milliseconds, config=None, identical=None, error=None):
        print(f"  {name} {config}: {milliseconds} ms, identical {identical}", flush=True)  # progress
        rows.append(
            {
                "name": name,
                "config": config,
                "ms": milliseconds,
                "floor_ms": floor_ms,
                "fraction_of_copy_bw": (floor_ms / milliseconds) if milliseconds else None,
                "bit_identical": identical,
                "error": error,
            }
        )

    # --- Triton kernels ------------------------------------------------------------------------
    reference_rows = quantize(x, "nvfp4")
    reference_2d = quantize(x, "nvfp4", tile=(16, 16))
    reference_columns = quantize(x.t(), "nvfp4")
    reference_columns_rht = quantize(rht(x.t()), "nvfp4")
    rows_configs_2d = [c for c in ROWS_CONFIGS if c[0] == 16]
    variants = [  # (name, configs, run(config), RNE reference or None, outputs transposed)
        ("rows 1x16 RNE", ROWS_CONFIGS, lambda c: kernels.nvfp4_quantize_rows(x, config=c), reference_rows, False),
        ("rows 1x16 SR", ROWS_CONFIGS,
         lambda c: kernels.nvfp4_quantize_rows(x, config=c, stochastic=True, seed=1), None, False),
        ("2D 16x16 RNE", rows_configs_2d,
         lambda c: kernels.nvfp4_quantize_rows(x, config=c, two_d=True), reference_2d, False),
        ("columns 16x1 RNE", COLUMNS_CONFIGS,
         lambda c: kernels.nvfp4_quantize_columns(x, config=c), reference_columns, True),
        ("columns 16x1 RHT RNE", COLUMNS_CONFIGS,
         lambda c: kernels.nvfp4_quantize_columns(x, config=c, rht=True), reference_columns_rht, True),
        ("columns 16x1 RHT SR", COLUMNS_CONFIGS,
         lambda c: kernels.nvfp4_quantize_columns(x, config=c, rht=True, stochastic=True, seed=1), None, True),
    ]
    for name, configs, run, reference, transposed in variants:
        for config in configs:
            try:
                identical = check_identical(run(config), reference, transposed) if reference is not None else None
                record(name, time_ms(lambda: run(config), **timing), config=list(config), identical=identical)
            except Exception as error:  # a launch shape that does not compile is reported, not fatal
                record(name, None, config=list(config), error=f"{type(error).__name__}: {error}")

    # The first pass alone (amax + finalize), for the share of the total; its floor is a read of x.
    read_floor_ms = x.numel() * x.element_size() / bandwidth * 1e3
    defaults = (kernels.AMAX_REDUCTION, kernels.AMAX_CONFIG, kernels.AMAX_PROGRAMS_PER_SM)
    amax_variants = [("torch", None, None)] + [("triton", c, p) for c in AMAX_CONFIGS for p in AMAX_PROGRAMS_PER_SM]
    try:
        for reduction, config, programs_per_sm in amax_variants:
            kernels.AMAX_REDUCTION = reduction
            if config is not None:
                kernels.AMAX_CONFIG, kernels.AMAX_PROGRAMS_PER_SM = config, programs_per_sm
            name = f"amax pass only, {reduction} (read floor)"
            config_row = None if config is None else [*config, programs_per_sm]
            try:
                milliseconds = time_ms(lambda: kernels.amax_global_scales(x, rht=False), **timing)
                print(f"  {name} {config_row}: {milliseconds} ms", flush=True)  # progress
                rows.append({"name": name, "config": config_row, "ms": milliseconds,
                             "floor_ms": read_floor_ms, "fraction_of_copy_bw": read_floor_ms / milliseconds,
                             "bit_identical": None, "error": None})
            except Exception as error:
                record(name, None, config=config_row, error=f"{type(error).__name__}: {error}")
    finally:
        kernels.AMAX_REDUCTION, kernels.AMAX_CONFIG, kernels.AMAX_PROGRAMS_PER_SM = defaults
    milliseconds = time_ms(lambda: kernels.amax_global_scales(x, rht=True), **timing)
    rows.append({"name": "amax pass with RHT only (read floor)", "config": None, "ms": milliseconds,
                 "floor_ms": read_floor_ms, "fraction_of_copy_bw": read_floor_ms / milliseconds,
                 "bit_identical": None, "error": None})

    # --- plain torch reference -----------------------------------------------------------------
    def reference_fn(tensor):
        return quantize(tensor, "nvfp4").scaled_values(torch.bfloat16)

    record("torch reference rows 1x16 (eager)", time_ms(lambda: reference_fn(x), iterations=10, warmup=2))
    if compile_reference:
        try:
            compiled = torch.compile(reference_fn)
            record("torch reference rows 1x16 (torch.compile)", time_ms(lambda: compiled(x), **timing))
        except Exception as error:
            record("torch reference rows 1x16 (torch.compile)", None, error=f"{type(error).__name__}: {error}")

    # --- report --------------------------------------------------------------------------------
    best = {}
    for row in rows:
        if row["ms"] is not None and (row["name"] not in best or row["ms"] < best[row["name"]]["ms"]):
            best[row["name"]] = row
    for row in rows:
        row["best_for_kernel"] = best.get(row["name"]) is row
    return {"rows": rows, "copy_bandwidth_bytes_per_s": bandwidth, "floor_ms": floor_ms}


def render(rows: list) -> list:
    """The printed table: one line per row (and its error, if any)."""
    lines = [f"{'kernel':42s} {'config':>10s} {'time us':>9s} {'of copy bw':>10s} {'identical':>9s}"]
    for row in rows:
        config = "x".join(map(str, row["config"])) if row["config"] else "-"
        timing_text = f"{row['ms'] * 1e3:9.1f}" if row["ms"] is not None else f"{'error':>9s}"
        fraction = f"{row['fraction_of_copy_bw']:10.1%}" if row["fraction_of_copy_bw"] else f"{'-':>10s}"
        identical = {None: "-", True: "yes", False: "NO"}[row["bit_identical"]]
        marker = " *" if row["best_for_kernel"] else ""
        lines.append(f"{row['name']:42s} {config:>10s} {timing_text} {fraction} {identical:>9s}{marker}")
        if row["error"]:
            lines.append(f"    {row['error'][:300]}")
    return lines
