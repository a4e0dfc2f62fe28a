"""One linear layer, forward + backward, in BF16 and FP8 on the present GPU (scripts/bench_fp8_linear.py).

For each shape (in_features x out_features) at ``--tokens`` bf16 tokens, side by side in one run:
- BF16 ``nn.Linear``;
- ``TorchFp8Linear`` with the fp8_block spec (1x128 activations/gradients, 128x128 weights, fused
  Triton quantization), the same with the plain-torch quantizer, and with the fp8_tensor spec;
- the emulated ``QuantLinear`` fp8_block (quantize-dequantize + BF16 GEMM), for reference;
- Transformer Engine ``te.Linear`` in BF16 and under ``Float8BlockScaling`` and
  ``Float8CurrentScaling``, when transformer_engine imports (skipped with a note otherwise);
- the three native FP8 GEMMs alone (operands quantized beforehand) and their BF16 counterparts;
- the fused quantization kernels alone (X and dY both orientations, W 128x128 both), for several
  warps per program, with the bandwidth they reach (bytes read + written).
Times are CUDA-event medians (benchmarks.timing) over ``--iters`` calls after ``--warmup`` calls.
TFLOP/s counts the three GEMMs, 3 x 2 M N K. "x BF16" is BF16's time over the case's (above 1: faster than BF16).
Weights are bf16 unless ``--weight-dtype float32`` (the trainer's fp32 master weights).
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
import torch.nn as nn

from benchmarks.timing import cuda_median_ms


def forward_backward(module: nn.Module, x: torch.Tensor, grad_output: torch.Tensor, context=None):
    """A closure running module(x) forward and backward, grads reset each call (no accumulation)."""
    def step():
        x.grad = None
        for parameter in module.parameters():
            parameter.grad = None
        with (context() if context is not None else contextlib.nullcontext()):
            y = module(x)
        y.backward(grad_output)

    return step


def te_cases(in_features: int, out_features: int, weight_dtype: torch.dtype, notes: List[str]) -> Dict[str, tuple]:
    """TE modules and their autocast factories, or {} with a note when TE does not import."""
    from models.quant import te_backend

    if not te_backend.has_te():
        notes.append(f"Transformer Engine does not import here: TE rows skipped ({te_backend.INSTALL_HINT})")
        return {}
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe as te_recipe

    def autocast_factory(recipe):
        if hasattr(te, "autocast"):
            return lambda: te.autocast(enabled=True, recipe=recipe)
        return lambda: te.fp8_autocast(enabled=True, fp8_recipe=recipe)

    def linear():
        return te.Linear(in_features, out_features, bias=False, params_dtype=weight_dtype, device="cuda")

    cases = {"te.Linear BF16": (linear(), None)}
    for label, recipe_class in (("Float8BlockScaling", "Float8BlockScaling"), ("Float8CurrentScaling", "Float8CurrentScaling")):
        try:
            cases[f"te.Linear {label}"] = (linear(), autocast_factory(getattr(te_recipe, recipe_class)()))
        except Exception as error:  # noqa: BLE001 - report and go on
            notes.append(f"TE {label}: {type(error).__name__}: {error}")
    return cases


@dataclass
class LinearBenchmark:
    """How to time (scripts/bench_fp8_linear.py's flags)."""

    tokens: int = 8192
    warmup: int = 10
    iters: int = 30
    weight_dtype: str = "bfloat16"
    quant_warps: List[int] = field(default_factory=lambda: [4, 8, 16])
    quant_two_pass: List[tuple] = field(default_factory=lambda: [(32, 32), (64, 64), (128, 128)])
    """Tile shapes (rows-pass tile rows, columns-pass tile cols) of the two-pass X / dY quantization
    timed alone (``Fp8Options``; the layer runs the defaults, ``FP8_OPTIONS``)."""
    skip_te: bool = False
    skip_emulated: bool = False
    skip_reference_quantizer: bool = False


def _layout(two_pass: tuple) -> str:
    """How X and dY are read: the tile shapes of the rows and the columns pass."""
    return f"two passes {two_pass[0]}/{two_pass[1]}"


def bench_shape(in_features: int, out_features: int, settings: LinearBenchmark, notes: List[str]) -> List[dict]:
    """Every case of one shape (printing each as it is timed); rows for render() and the JSON."""
    from models.quant import kernels
    from models.quant.fp8_torch import TorchFp8Linear, fp8_gemm, quantize_operands
    from models.quant.gemm_spec import OperandSpec, fp8_block_linear_spec, fp8_tensor_linear_spec
    from models.quant.kernels import fp8 as fp8_kernels
    from models.quant.kernels.options import FP8_OPTIONS, Fp8Options
    from models.quant.linear import QuantLinear

    tokens = settings.tokens
    weight_dtype = getattr(torch, settings.weight_dtype)
    flops = 6.0 * tokens * in_features * out_features
    shape = f"{in_features}x{out_features}"
    torch.manual_seed(0)
    x = torch.randn(tokens, in_features, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad_output = torch.randn(tokens, out_features, device="cuda", dtype=torch.bfloat16)
    base = nn.Linear(in_features, out_features, bias=False, device="cuda", dtype=weight_dtype)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if weight_dtype != torch.bfloat16 else None

    rows: List[dict] = []

    def record(case: str, ms: float, layer_flops: Optional[float] = flops, kind: str = "layer"):
        rows.append({"shape": shape, "tokens": tokens, "kind": kind, "case": case, "ms": ms,
                     "tflops": layer_flops / ms / 1e9 if layer_flops else None})
        print(f"  {case:<44} {ms:9.3f} ms" + (f"  {layer_flops / ms / 1e9:8.1f} TFLOP/s" if layer_flops else ""),
              flush=True)

    def time_layer(case: str, module: nn.Module, context=None, triton_on: bool = True):
        kernels.use_triton(triton_on)
        try:
            record(case, cuda_median_ms(forward_backward(module, x, grad_output, context), settings.warmup, settings.iters))
        except Exception as error:  # noqa: BLE001 - one failing case must not hide the others
            notes.append(f"{shape} {case}: {type(error).__name__}: {error}")
            print(f"  {case:<44} failed: {type(error).__name__}: {error}", flush=True)
        finally:
            kernels.use_triton(True)

    print(f"{shape}, {tokens} tokens, weights {settings.weight_dtype}:", flush=True)
    time_layer("BF16 nn.Linear", base, autocast)
    fp8_block = TorchFp8Linear.from_linear(base, fp8_block_linear_spec(), name=shape)
    time_layer("FP8 blockwise, torch backend (fused quant)", fp8_block, autocast)
    if not settings.skip_reference_quantizer:
        time_layer("FP8 blockwise, torch backend (torch-ops quant)", fp8_block, autocast, triton_on=False)
    fp8_tensor = TorchFp8Linear.from_linear(base, fp8_tensor_linear_spec(), name=shape)
    time_layer("FP8 per-tensor, torch backend", fp8_tensor, autocast)
    if not settings.skip_emulated:
        time_layer("FP8 blockwise, emulated (QuantLinear)", QuantLinear.from_linear(base, fp8_block_linear_spec(), name=shape),
                   autocast)
    if not settings.skip_te:
        for case, (module, context) in te_cases(in_features, out_features, weight_dtype, notes).items():
            time_layer(case, module, context)

    # Sanity: the native layer's output against the emulated path's (same quantized operands).
    with torch.no_grad(), (autocast() if autocast else torch.autocast("cuda", enabled=False)):
        native = fp8_block(x[:1024])
        emulated = QuantLinear.from_linear(base, fp8_block_linear_spec(), name=shape)(x[:1024])
    mismatch = ((native.float() - emulated.float()).abs().max() / emulated.float().abs().max()).item()
    notes.append(f"{shape}: max |native - emulated| / max |emulated| on Y = {mismatch:.2e}")

    # The three GEMMs alone, operands quantized beforehand; and BF16's.
    vector, tile = OperandSpec("fp8_block", (1, 128)), OperandSpec("fp8_block", (128, 128))
    x_op, x_t_op = quantize_operands(x.detach(), vector, vector)
    w_op, w_t_op = quantize_operands(base.weight.detach(), tile, tile)
    dy_op, dy_t_op = quantize_operands(grad_output, vector, vector)
    gemm_flops = 2.0 * tokens * in_features * out_features
    fp8_total = bf16_total = 0.0
    weight_bf16 = base.weight.detach().to(torch.bfloat16)
    for gemm, (a, b), bf16 in (
        ("Fprop", (x_op, w_op), lambda: x.detach() @ weight_bf16.t()),
        ("Dgrad", (dy_op, w_t_op), lambda: grad_output @ weight_bf16),
        ("Wgrad", (dy_t_op, x_t_op), lambda: grad_output.t() @ x.detach()),
    ):
        ms = cuda_median_ms(lambda: fp8_gemm(a, b, torch.bfloat16), settings.warmup, settings.iters)
        fp8_total += ms
        record(f"GEMM only: FP8 blockwise {gemm}", ms, gemm_flops, kind="gemm")
        ms = cuda_median_ms(bf16, settings.warmup, settings.iters)
        bf16_total += ms
        record(f"GEMM only: BF16 {gemm}", ms, gemm_flops, kind="gemm")
    record("GEMM only: FP8 blockwise, 3 GEMMs", fp8_total, flops, kind="gemm")
    record("GEMM only: BF16, 3 GEMMs", bf16_total, flops, kind="gemm")

    # The fused quantization kernels alone, for several warps per program.
    def quant_bytes(tensor, outputs):
        return tensor.numel() * tensor.element_size() + outputs * tensor.numel()  # read + fp8 codes written

    quantize_best_total = 0.0
    for label, tensor, two_d in (("X [T, K] rows + columns", x.detach(), False),
                                 ("W [N, K] 128x128, W and W^T", base.weight.detach(), True),
                                 ("dY [T, N] rows + columns", grad_output, False)):
        best = None
        if two_d:  # 128x128 tiles: one read writes W and W^T
            for warps in settings.quant_warps:
                options = Fp8Options(num_warps=warps)
                ms = cuda_median_ms(lambda: fp8_kernels.fp8_block_quantize(tensor, tile_2d=True, rows=True, columns=True,
                                                                            options=options),
                                    settings.warmup, settings.iters)
                gbps = quant_bytes(tensor, 2) / ms / 1e6
                rows.append({"shape": shape, "tokens": tokens, "kind": "quantize",
                             "case": f"{label}, one read, {warps} warps", "ms": ms, "gb_per_s": gbps})
                print(f"  quantize {label + ', one read':<42} {warps:2d} warps {ms:8.3f} ms  {gbps:7.0f} GB/s", flush=True)
                best = ms if best is None else min(best, ms)
        two_passes = settings.quant_two_pass if not two_d else []
        for two_pass, warps in itertools.product(two_passes, settings.quant_warps):
            options = Fp8Options(rows_pass_tile_rows=two_pass[0], columns_pass_tile_cols=two_pass[1], num_warps=warps)
            ms = cuda_median_ms(lambda: fp8_kernels.fp8_block_quantize(tensor, tile_2d=False, rows=True, columns=True,
                                                                        options=options),
                                settings.warmup, settings.iters)
            gbps = quant_bytes(tensor, 2) / ms / 1e6  # the bytes the result needs, not the two reads
            case = f"{label}, {_layout(two_pass)}, {warps} warps"
            rows.append({"shape": shape, "tokens": tokens, "kind": "quantize", "case": case, "ms": ms, "gb_per_s": gbps})
            print(f"  quantize {case:<52} {ms:8.3f} ms  {gbps:7.0f} GB/s", flush=True)
            best = ms if best is None else min(best, ms)
        quantize_best_total += best

    # Where the fused layer's time goes: GEMMs + quantization kernels vs the whole layer.
    layer = next((row["ms"] for row in rows if row["case"] == "FP8 blockwise, torch backend (fused quant)"), None)
    if layer is not None:
        parts = fp8_total + quantize_best_total
        notes.append(f"{shape}: FP8 blockwise layer {layer:.3f} ms = GEMMs {fp8_total:.3f} + quantization kernels "
                     f"{quantize_best_total:.3f} (best of the layouts and warps timed; the layer uses "
                     f"{_layout((FP8_OPTIONS.rows_pass_tile_rows, FP8_OPTIONS.columns_pass_tile_cols))} at "
                     f"{FP8_OPTIONS.num_warps} warps) + "
                     f"the rest {layer - parts:.3f} (scale padding, autograd, launches)")
    return rows


def render(rows: List[dict]) -> str:
    lines = []
    for shape in dict.fromkeys(row["shape"] for row in rows):
        shape_rows = [row for row in rows if row["shape"] == shape and row["kind"] == "layer"]
        bf16 = next((row["ms"] for row in shape_rows if row["case"] == "BF16 nn.Linear"), None)
        lines.append(f"\n{shape} at {shape_rows[0]['tokens'] if shape_rows else '?'} tokens, forward + backward")
        lines.append(f"  {'case':<46} {'ms':>9} {'TFLOP/s':>9} {'x BF16':>8}")
        for row in shape_rows:
            ratio = f"{bf16 / row['ms']:8.2f}" if bf16 else "       -"
            lines.append(f"  {row['case']:<46} {row['ms']:9.3f} {row['tflops']:9.1f} {ratio}")
        for row in rows:
            if row["shape"] == shape and row["kind"] == "gemm":
                lines.append(f"  {row['case']:<46} {row['ms']:9.3f} {row['tflops']:9.1f}")
        for row in rows:
            if row["shape"] == shape and row["kind"] == "quantize":
                lines.append(f"  quantize {row['case']:<37} {row['ms']:9.3f} {row['gb_per_s']:7.0f} GB/s")
    return "\n".join(lines)


def software_versions() -> Dict[str, Optional[str]]:
    """Versions of the optional packages the cases run through (None: not importable)."""
    versions: Dict[str, Optional[str]] = {"triton": None, "transformer_engine": None}
    try:
        import triton

        versions["triton"] = triton.__version__
    except ImportError:
        pass
    try:
        import transformer_engine

        versions["transformer_engine"] = transformer_engine.__version__
    except Exception:  # noqa: BLE001 - a broken TE install is reported as absent
        pass
    return versions
