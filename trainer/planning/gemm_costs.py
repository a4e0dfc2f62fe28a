"""The GEMM cost model: the modelled time of each GEMM in each input format on each GPU (no GPU needed).

Per GEMM C[M,N] = A[M,K] B[K,N], GPU peaks and bandwidth from trainer/hardware.py:

    t_bf16   = max(F / P_bf16,  (2MK + 2NK + 2MN) / BW)            F = 2MNK (attention: causal half)
    t_gemm_f = max(F / P_f,     (bytes_f(A) + bytes_f(B) + 2MN) / BW)
    t_quant  = (read the BF16 operands that must be (re)quantized for this GEMM, r times,
                write their low-precision elements and block scales) / BW
    t_f      = t_gemm_f + t_quant          (--overhead sum, default: separate quantize kernels)
             | max(t_gemm_f, t_quant)      (--overhead overlap: quantization fully hidden)
             | t_gemm_f                    (--overhead none: peak-rate ratio only)
    speedup  = t_bf16 / t_f

Which operands a GEMM quantizes (every orientation from the high-precision tensor, never from a
quantized one, as TE does):
    Fprop  X along K (activation blocks) and W (weight tiles).
    Dgrad  dY along N; W^T only if the weight tiles are not transpose-invariant (MX 1x32 blocks):
           NVFP4 16x16 and FP8 128x128 tiles (and per-tensor scales) reuse Fprop's quantized W.
    Wgrad  dY^T and X^T along tokens (the transposed orientation: Hopper FP8 and the block formats
           need both operands K-major, so they are quantized again; NVFP4's RHT is fused, no extra
           traffic modelled).
Assumptions: high-precision operands are BF16 (2 bytes; FP32 master weights would double W's read);
GEMM outputs BF16; every operand is read once by the GEMM (ideal tiling); r = 2 for formats with a
per-tensor scale (NVFP4, per-tensor FP8: an amax pass before the cast), r = 1 otherwise; W is
quantized once per micro-batch (with gradient accumulation TE caches it: W's cost shrinks); no
overlap between GEMMs. Attention BMMs stay BF16 and are modelled compute-bound (flash attention keeps
the s x s scores on chip). Nothing here knows about kernel efficiency: measured BF16 GEMMs on H200
reach 660-820 of 989 TFLOP/s (docs/performance.md), so read the numbers as ratios of ideal times.

Format bytes per element (elements + block scales): BF16 2; FP8 (the paper's baseline, E4M3 with
fp32 scales per 1x128 activation/gradient block and per 128x128 weight tile) 1 + 4/128 (weights
1 + 4/16384); MXFP8 1 + 1/32; MXFP4 0.5 + 1/32; NVFP4 0.5 + 1/16 (2D weights 0.5 + 1/256) plus one
fp32 tensor scale. MXFP4 runs at the datasheets' single "FP4 Tensor Core" rate, listed as nvfp4.

Bytes per element and block sizes are read from the format registry
(models/quant/format_registry.py, FormatSpec); FORMAT_COSTS is that registry seen by the cost model.
Its names are the report's: 'fp8' is the registry's fp8_block (REPORT_NAMES; RECIPE_FORMATS maps
PrecisionConfig.format onto them).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Dict, Optional

from models.config import ModelConfig
from models.gemms import ATTENTION_KIND, Gemm
from models.quant.format_registry import FORMAT_SPECS, FormatSpec, OperandCosts
from trainer.hardware import GpuSpec

HIGH_PRECISION_BYTES = 2
"""Bytes per element of the operands before quantization (BF16 activations, gradients, weight copy)."""
OUTPUT_BYTES = 2
"""Bytes per element of every GEMM output (BF16)."""


@dataclass(frozen=True)
class FormatCost(OperandCosts):
    """What one GEMM input format costs in memory traffic, and which peak rate it runs at.

    The registry's cost fields (OperandCosts, models/quant/format_registry.py) under the report's
    name; ``costs_for_recipe`` adjusts them for a recipe.
    """

    name: str
    label: str


REPORT_NAMES = {"fp8_block": "fp8"}
"""Registry name -> the report's name, where they differ (the report's tables and CSV say 'fp8')."""


def _cost_from_registry(spec: FormatSpec) -> FormatCost:
    costs = {field.name: getattr(spec, field.name) for field in fields(OperandCosts)}
    return FormatCost(REPORT_NAMES.get(spec.name, spec.name), spec.label, **costs)


# The cost of every format of the registry (models/quant/format_registry.py holds the bytes and
# block sizes), by the report's name, plus BF16.
FORMAT_COSTS: Dict[str, FormatCost] = {
    "bf16": FormatCost("bf16", "BF16", peak_key="bf16", element_bytes=2.0),
    **{REPORT_NAMES.get(name, name): _cost_from_registry(spec) for name, spec in FORMAT_SPECS.items()},
}
DEFAULT_FORMATS = ("fp8", "mxfp8", "nvfp4")
"""Formats compared against BF16 in the printed tables (the CSV has the same ones)."""

# PrecisionConfig.format -> the report's format name.
RECIPE_FORMATS = {"bf16": "bf16", **{name: REPORT_NAMES.get(name, name) for name in FORMAT_SPECS}}
OVERHEAD_MODES = ("sum", "overlap", "none")

@dataclass(frozen=True)
class GemmTime:
    """Modelled seconds of one GEMM in one format on one GPU."""

    compute: float
    """F / peak."""
    memory: float
    """GEMM operand and output traffic / bandwidth."""
    quantization: float
    """Traffic of quantizing this GEMM's operands / bandwidth (0 in BF16)."""
    total: float


def peak_rate(gpu: GpuSpec, fmt: str, costs: Dict[str, FormatCost] = FORMAT_COSTS) -> Optional[float]:
    """Dense FLOP/s of ``fmt`` on ``gpu``; None when the GPU has no native GEMM in that format."""
    return gpu.peak_flops.get(costs[fmt].peak_key)


def gemm_operand_bytes(gemm: Gemm, fmt: str, costs: Dict[str, FormatCost] = FORMAT_COSTS) -> float:
    """Bytes the GEMM itself moves in ``fmt``: A [M,K] + B [N,K] (quantized) + C [M,N] (BF16 output)."""
    cost = costs[fmt]
    a_elements, b_elements = gemm.M * gemm.K * gemm.batch, gemm.N * gemm.K * gemm.batch
    output = gemm.M * gemm.N * gemm.batch * OUTPUT_BYTES
    if fmt == "bf16":
        return (a_elements + b_elements) * HIGH_PRECISION_BYTES + output
    b_bytes = cost.weight_bytes(b_elements) if gemm.kind in ("fprop", "dgrad") else cost.vector_bytes(b_elements)
    return cost.vector_bytes(a_elements) + b_bytes + output


def quantization_bytes(gemm: Gemm, fmt: str, costs: Dict[str, FormatCost] = FORMAT_COSTS,
                       input_share: float = 1.0, gradient_share: float = 1.0) -> float:
    """Bytes moved to quantize the operands this GEMM needs in ``fmt`` (see the module docstring).
    ``input_share`` / ``gradient_share``: the part of the input X (Fprop's A, Wgrad's X^T) / of the output's
    gradient (Dgrad's dY, Wgrad's dY^T) this rank quantizes: 1 / tp where a linear quantizes its rank's tokens
    before gathering them along the sequence."""
    if fmt == "bf16" or gemm.kind == ATTENTION_KIND:
        return 0.0
    cost = costs[fmt]
    read = HIGH_PRECISION_BYTES * cost.reads_per_quantization
    a_elements, b_elements = gemm.M * gemm.K, gemm.N * gemm.K
    if gemm.kind == "fprop":
        a_elements *= input_share
    else:
        a_elements *= gradient_share
        if gemm.kind == "wgrad":
            b_elements *= input_share
    # A is X (Fprop), dY (Dgrad) or dY^T (Wgrad): always an activation/gradient operand.
    total = a_elements * read + cost.vector_bytes(a_elements)
    if gemm.kind == "fprop":
        total += b_elements * read + cost.weight_bytes(b_elements)  # W
    elif gemm.kind == "dgrad":
        if not cost.weight_transpose_invariant:
            total += b_elements * read + cost.vector_bytes(b_elements)  # W^T re-quantized along N
    else:  # wgrad: X^T along tokens
        total += b_elements * read + cost.vector_bytes(b_elements)
    return total


def gemm_time(
    gemm: Gemm, fmt: str, gpu: GpuSpec, overhead: str = "sum", costs: Dict[str, FormatCost] = FORMAT_COSTS
) -> Optional[GemmTime]:
    """Modelled time of ``gemm`` in ``fmt`` on ``gpu``; None if the GPU has no such GEMM.

    Attention BMMs and any GEMM asked for in 'bf16' take the BF16 time.
    """
    if overhead not in OVERHEAD_MODES:
        raise ValueError(f"overhead must be one of {OVERHEAD_MODES}, got {overhead!r}")
    if gemm.kind == ATTENTION_KIND:
        compute = gemm.flops / gpu.peak_flops["bf16"]
        return GemmTime(compute, 0.0, 0.0, compute)
    peak = peak_rate(gpu, fmt, costs)
    if peak is None:
        return None
    compute = gemm.flops / peak
    memory = gemm_operand_bytes(gemm, fmt, costs) / gpu.hbm_bytes_per_s
    quantization = quantization_bytes(gemm, fmt, costs) / gpu.hbm_bytes_per_s
    core = max(compute, memory)
    if overhead == "sum":
        total = core + quantization
    elif overhead == "overlap":
        total = max(core, quantization)
    else:
        total = core
    return GemmTime(compute, memory, quantization, total)


def speedup(
    gemm: Gemm, fmt: str, gpu: GpuSpec, overhead: str = "sum", costs: Dict[str, FormatCost] = FORMAT_COSTS
) -> Optional[float]:
    """t_bf16 / t_fmt for one GEMM (1.0 for attention BMMs, which stay BF16); None if not native."""
    low = gemm_time(gemm, fmt, gpu, overhead, costs)
    if low is None:
        return None
    return gemm_time(gemm, "bf16", gpu, overhead, costs).total / low.total



def costs_for_recipe(precision) -> Dict[str, FormatCost]:
    """The format costs, adjusted for recipe knobs that change them: NVFP4 without 2D weights uses 1x16
    weight blocks and re-quantizes W^T for Dgrad."""
    costs = dict(FORMAT_COSTS)
    if precision is not None and precision.format == "nvfp4" and not precision.weight_2d:
        costs["nvfp4"] = replace(
            costs["nvfp4"], weight_block=16, weight_transpose_invariant=False,
            label="NVFP4 (E2M1, 1x16 E4M3 scales, 1D weights + fp32 tensor scale)",
        )
    return costs


def recipe_gemm_formats(cfg: ModelConfig, precision) -> Dict[str, Dict[str, str]]:
    """Linear name -> {fprop|dgrad|wgrad: report format or 'bf16'} as the trainer's precision pass plans it.

    Builds the model on the meta device (no memory) and asks models.quant.recipe.plan_layers, so the
    report and the trainer agree on every layer by construction.
    """
    import torch

    from models import build_model
    from models.quant.recipe import plan_layers

    if precision.format not in RECIPE_FORMATS:
        raise ValueError(f"precision.format {precision.format!r} has no cost model; known: {sorted(RECIPE_FORMATS)}")
    with torch.device("meta"):
        model = build_model(cfg)
    plans = plan_layers(model, precision)
    return {
        plan.name: {gemm: (RECIPE_FORMATS[fmt] if fmt != "bf16" else "bf16") for gemm, fmt in plan.gemm_formats.items()}
        for plan in plans
    }
