"""Every GEMM of a training step, its FLOPs, and what each low-precision format buys on each GPU.

    python scripts/gemm_report.py --config hybrid_12b                      # theory, no GPU needed
    python scripts/gemm_report.py --config hybrid_12b --precision nvfp4 --csv gemms_12b.csv
    python scripts/gemm_report.py --config hybrid_12b --measure            # + timings on this GPU

--config is a name under configs/model/ or a yaml path; --tokens is the tokens of one micro-batch
(default 8192), --seq-len the sequence length (default --tokens: one sequence). The GEMM list comes
from models.gemms (Fprop, Dgrad, Wgrad of every linear; attention BMMs, always BF16). --precision
names a recipe of configs/precision/ (or a yaml path): the report marks which GEMMs that recipe keeps
in BF16 (first/last pattern symbols, lm_head, globs, GEMMs the recipe leaves unquantized) exactly as
the trainer's precision pass (models.quant.recipe.plan_layers) decides, and adds the step speedup of
the recipe.

Cost model (per GEMM C[M,N] = A[M,K] B[K,N], GPU peaks and bandwidth from trainer/hardware.py):

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
reach 660-820 of 989 TFLOP/s (DESIGN.md), so read the numbers as ratios of ideal times.

Format bytes per element (elements + block scales): BF16 2; FP8 (the paper's baseline, E4M3 with
fp32 scales per 1x128 activation/gradient block and per 128x128 weight tile) 1 + 4/128 (weights
1 + 4/16384); MXFP8 1 + 1/32; MXFP4 0.5 + 1/32; NVFP4 0.5 + 1/16 (2D weights 0.5 + 1/256) plus one
fp32 tensor scale. MXFP4 runs at the datasheets' single "FP4 Tensor Core" rate, listed as nvfp4.

--measure times each distinct linear GEMM shape on the present CUDA GPU with CUDA events (after
warm-up; median of --iters): BF16 torch.matmul, FP8 torch._scaled_mm with tensorwise scales and with
DeepSeek-style blockwise scales (1x128 activations x 128x128 weights for Fprop/Dgrad, 1x128 x 1x128
for Wgrad), and on compute capability >= 10 MXFP8 (1x32, E8M0) and NVFP4 (1x16, E4M3 block scales)
through torch._scaled_mm. Scale values are ones (timing does not depend on them); operands in the
TN layout cuBLAS wants (A row-major, B column-major). A variant this torch/GPU refuses is reported as
unsupported with the error's first line. Quantization kernels are not timed. Attention BMMs are not
measured (they run inside SDPA/flash attention).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

REPOSITORY = Path(__file__).resolve().parent.parent
if str(REPOSITORY) not in sys.path:  # run as a file from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPOSITORY))

from models.config import ModelConfig, load_model_config  # noqa: E402
from models.flops import flops_breakdown  # noqa: E402
from models.gemms import ATTENTION_KIND, Gemm, training_gemms  # noqa: E402
from trainer.hardware import GPUS, GpuSpec  # noqa: E402

HIGH_PRECISION_BYTES = 2
"""Bytes per element of the operands before quantization (BF16 activations, gradients, weight copy)."""
OUTPUT_BYTES = 2
"""Bytes per element of every GEMM output (BF16)."""


@dataclass(frozen=True)
class FormatCost:
    """What one GEMM input format costs in memory traffic, and which peak rate it runs at."""

    name: str
    label: str
    peak_key: str
    """Key of trainer.hardware.GpuSpec.peak_flops giving this format's dense tensor-core rate."""
    element_bytes: float
    vector_block: int = 1
    """Elements per scale of activation and gradient operands (blocks along the reduction dim)."""
    vector_scale_bytes: float = 0.0
    weight_block: int = 1
    """Elements per scale of the weight operand (a 2D tile counts its area)."""
    weight_scale_bytes: float = 0.0
    weight_transpose_invariant: bool = True
    """Dgrad can reuse Fprop's quantized W (2D tiles or a per-tensor scale)."""
    amax_pass: bool = False
    """A per-tensor scale needs the tensor's amax first: the high-precision operand is read twice."""
    tensor_scale_bytes: float = 0.0

    def vector_bytes(self, elements: float) -> float:
        """Bytes of an activation/gradient operand of ``elements`` values in this format (scales included)."""
        scales = elements / self.vector_block * self.vector_scale_bytes if self.vector_scale_bytes else 0.0
        return elements * self.element_bytes + scales + self.tensor_scale_bytes

    def weight_bytes(self, elements: float) -> float:
        """Bytes of a weight operand of ``elements`` values in this format (scales included)."""
        scales = elements / self.weight_block * self.weight_scale_bytes if self.weight_scale_bytes else 0.0
        return elements * self.element_bytes + scales + self.tensor_scale_bytes

    @property
    def reads_per_quantization(self) -> int:
        return 2 if self.amax_pass else 1


FORMAT_COSTS: Dict[str, FormatCost] = {
    "bf16": FormatCost("bf16", "BF16", "bf16", 2.0),
    "fp8": FormatCost(
        "fp8", "FP8 (E4M3, 1x128 / 128x128 fp32 scales)", "fp8", 1.0,
        vector_block=128, vector_scale_bytes=4, weight_block=128 * 128, weight_scale_bytes=4,
    ),
    "fp8_tensor": FormatCost(
        "fp8_tensor", "FP8 (E4M3, per-tensor scale)", "fp8", 1.0, amax_pass=True, tensor_scale_bytes=4,
    ),
    "mxfp8": FormatCost(
        "mxfp8", "MXFP8 (E4M3, 1x32 E8M0 scales)", "mxfp8", 1.0,
        vector_block=32, vector_scale_bytes=1, weight_block=32, weight_scale_bytes=1,
        weight_transpose_invariant=False,
    ),
    "mxfp4": FormatCost(
        "mxfp4", "MXFP4 (E2M1, 1x32 E8M0 scales)", "nvfp4", 0.5,
        vector_block=32, vector_scale_bytes=1, weight_block=32, weight_scale_bytes=1,
        weight_transpose_invariant=False,
    ),
    "nvfp4": FormatCost(
        "nvfp4", "NVFP4 (E2M1, 1x16 / 16x16 E4M3 scales + fp32 tensor scale)", "nvfp4", 0.5,
        vector_block=16, vector_scale_bytes=1, weight_block=16 * 16, weight_scale_bytes=1,
        amax_pass=True, tensor_scale_bytes=4,
    ),
}
DEFAULT_FORMATS = ("fp8", "mxfp8", "nvfp4")
"""Formats compared against BF16 in the printed tables (the CSV has the same ones)."""

# PrecisionConfig.format -> the report's format name.
RECIPE_FORMATS = {
    "bf16": "bf16", "nvfp4": "nvfp4", "mxfp4": "mxfp4", "mxfp8": "mxfp8", "fp8_block": "fp8", "fp8_tensor": "fp8_tensor",
}
OVERHEAD_MODES = ("sum", "overlap", "none")


# ------------------------------------------------------------------------------------ cost model
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


def quantization_bytes(gemm: Gemm, fmt: str, costs: Dict[str, FormatCost] = FORMAT_COSTS) -> float:
    """Bytes moved to quantize the operands this GEMM needs in ``fmt`` (see the module docstring)."""
    if fmt == "bf16" or gemm.kind == ATTENTION_KIND:
        return 0.0
    cost = costs[fmt]
    read = HIGH_PRECISION_BYTES * cost.reads_per_quantization
    a_elements, b_elements = gemm.M * gemm.K, gemm.N * gemm.K
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


# ------------------------------------------------------------------------------------ configs
def load_precision_config(name_or_path: str):
    """PrecisionConfig from configs/precision/<name>.yaml or a yaml path (unknown keys fail, naming them)."""
    from omegaconf import OmegaConf

    from models.quant.config import PrecisionConfig

    directory = REPOSITORY / "configs" / "precision"
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = directory / f"{name_or_path}.yaml"
    if not path.is_file():
        available = sorted(p.stem for p in directory.glob("*.yaml"))
        raise FileNotFoundError(f"precision config {name_or_path!r} not found (looked for {path}; available: {available})")
    merged = OmegaConf.merge(OmegaConf.structured(PrecisionConfig), OmegaConf.load(path))
    return OmegaConf.to_object(merged)


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


# ------------------------------------------------------------------------------------ the report
@dataclass
class Report:
    cfg: ModelConfig
    tokens: int
    seq_len: int
    gemms: List[Gemm]
    gpus: List[GpuSpec]
    formats: List[str]
    overhead: str
    costs: Dict[str, FormatCost]
    """Format costs of this report (FORMAT_COSTS adjusted for the recipe's knobs)."""
    step_flops: float
    """Model FLOPs of the step (models.flops, the MFU numerator): GEMMs plus the SSD scan estimate."""
    plan: Optional[Dict[tuple, str]] = None
    """GEMM key (name, kind) -> the format the recipe runs it in ('bf16' or the report format)."""
    recipe_name: Optional[str] = None
    recipe_format: Optional[str] = None
    measured: Optional[Dict[tuple, Dict[str, object]]] = None
    """(M, N, K, kind) -> variant -> seconds (float) or 'unsupported: ...' (str)."""

    def planned_format(self, gemm: Gemm) -> str:
        if self.plan is None:
            return "bf16" if not gemm.quantizable else "-"
        return self.plan.get((gemm.name, gemm.kind), "bf16")

    def time(self, gemm: Gemm, fmt: str, gpu: GpuSpec) -> Optional[float]:
        """Seconds of ``gemm`` if run in ``fmt`` (BF16 when it is not quantizable)."""
        effective = fmt if gemm.quantizable else "bf16"
        result = gemm_time(gemm, effective, gpu, self.overhead, self.costs)
        return None if result is None else result.total

    def gemm_time(self, gemm: Gemm, fmt: str, gpu: GpuSpec) -> Optional[GemmTime]:
        return gemm_time(gemm, fmt, gpu, self.overhead, self.costs)

    def speedup(self, gemm: Gemm, fmt: str, gpu: GpuSpec) -> Optional[float]:
        """Modelled speedup of ``gemm`` in ``fmt`` (1.0 for GEMMs that stay BF16: lm_head, attention)."""
        if not gemm.quantizable:
            return 1.0
        return speedup(gemm, fmt, gpu, self.overhead, self.costs)


def build_report(
    cfg: ModelConfig,
    tokens: int = 8192,
    seq_len: Optional[int] = None,
    precision=None,
    gpus: Optional[Sequence[str]] = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
    overhead: str = "sum",
) -> Report:
    """The GEMMs of one micro-batch of ``cfg`` with the cost model's inputs (no printing)."""
    seq_len = tokens if seq_len is None else seq_len
    unknown = [f for f in formats if f not in FORMAT_COSTS or f == "bf16"]
    if unknown:
        raise ValueError(f"unknown --formats {unknown}; choose from {[f for f in FORMAT_COSTS if f != 'bf16']}")
    gpu_names = list(GPUS) if not gpus else list(gpus)
    missing = [g for g in gpu_names if g not in GPUS]
    if missing:
        raise ValueError(f"unknown GPU(s) {missing}; trainer/hardware.py knows {list(GPUS)}")
    if overhead not in OVERHEAD_MODES:
        raise ValueError(f"--overhead must be one of {OVERHEAD_MODES}, got {overhead!r}")
    gemms = training_gemms(cfg, tokens, seq_len)
    report = Report(
        cfg=cfg, tokens=tokens, seq_len=seq_len, gemms=gemms, gpus=[GPUS[g] for g in gpu_names],
        formats=list(formats), overhead=overhead, costs=costs_for_recipe(precision),
        step_flops=sum(flops_breakdown(cfg, seq_len).values()) * tokens,
    )
    if precision is not None:
        formats_by_layer = recipe_gemm_formats(cfg, precision)
        report.plan = {}
        for gemm in gemms:
            if gemm.kind == ATTENTION_KIND:
                report.plan[(gemm.name, gemm.kind)] = "bf16"
                continue
            if gemm.name not in formats_by_layer:
                raise RuntimeError(f"GEMM list and model disagree: no linear named {gemm.name!r} in the built model")
            report.plan[(gemm.name, gemm.kind)] = formats_by_layer[gemm.name][gemm.kind]
        report.recipe_name = precision.name
        report.recipe_format = RECIPE_FORMATS[precision.format]
    return report


def step_time(report: Report, gpu: GpuSpec, fmt: Optional[str], use_plan: bool = False) -> Optional[float]:
    """Modelled seconds of all GEMMs of the step: every quantizable GEMM in ``fmt`` (None: all BF16),
    or, with ``use_plan``, each GEMM in the format the recipe gives it."""
    total = 0.0
    for gemm in report.gemms:
        if use_plan:
            chosen = report.planned_format(gemm)
        else:
            chosen = fmt if (fmt is not None and gemm.quantizable) else "bf16"
        result = report.gemm_time(gemm, chosen, gpu)
        if result is None:
            return None
        total += result.total
    return total


def quantization_share(report: Report, gpu: GpuSpec, fmt: str) -> Optional[float]:
    """Share of the modelled step GEMM time (all quantizable GEMMs in ``fmt``) spent quantizing."""
    total = step_time(report, gpu, fmt)
    if total is None:
        return None
    quantization = sum(report.gemm_time(g, fmt, gpu).quantization for g in report.gemms if g.quantizable)
    return quantization / total if report.overhead == "sum" else None


# ------------------------------------------------------------------------------------ rendering
def _ms(seconds: Optional[float]) -> str:
    """Milliseconds with ~4 significant digits (tiny configs take microseconds)."""
    if seconds is None:
        return "-"
    ms = 1e3 * seconds
    return f"{ms:.1f}" if ms >= 100 else f"{ms:.2f}" if ms >= 1 else f"{ms:.4f}"


def _fmt_speedup(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


def _table(header: Sequence[str], rows: Iterable[Sequence[object]], align_left: int = 1) -> List[str]:
    rows = [[str(cell) for cell in row] for row in rows]
    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) if rows else len(header[i]) for i in range(len(header))]

    def line(cells):
        return "  ".join(cell.ljust(w) if i < align_left else cell.rjust(w) for i, (cell, w) in enumerate(zip(cells, widths)))

    return [line(header), "  ".join("-" * w for w in widths)] + [line(row) for row in rows]


def _speedup_columns(report: Report) -> List[tuple]:
    """(format, gpu) pairs shown as columns: every selected GPU with a native GEMM in the format."""
    return [(fmt, gpu) for fmt in report.formats for gpu in report.gpus if peak_rate(gpu, fmt, report.costs) is not None]


def _column_label(fmt: str, gpu: GpuSpec) -> str:
    return f"{fmt.upper()} {gpu.name}"


def group_gemms(report: Report) -> "OrderedDict[tuple, List[Gemm]]":
    """Identical GEMMs of repeated blocks: key (layer_type, kind, M, N, K, batch, planned format).

    Ordered by the first appearance of (layer_type, kind), so a layer type's BF16 and quantized
    rows sit together.
    """
    groups: Dict[tuple, List[Gemm]] = {}
    first_seen: Dict[tuple, int] = {}
    for gemm in report.gemms:
        first_seen.setdefault((gemm.layer_type, gemm.kind), len(first_seen))
        key = (gemm.layer_type, gemm.kind, gemm.M, gemm.N, gemm.K, gemm.batch, report.planned_format(gemm))
        groups.setdefault(key, []).append(gemm)
    ordered = sorted(groups, key=lambda key: (first_seen[(key[0], key[1])], key[6] != "bf16"))
    return OrderedDict((key, groups[key]) for key in ordered)


ATTENTION_BMMS = "attention BMMs"


def layer_type_summary(report: Report) -> "OrderedDict[str, dict]":
    """Per layer type (Fprop + Dgrad + Wgrad of all its layers): FLOP share and speedup per (format, GPU).

    The six attention BMMs of every attention block are one entry, ``ATTENTION_BMMS``.
    """
    summary: "OrderedDict[str, dict]" = OrderedDict()
    for gemm in report.gemms:
        key = ATTENTION_BMMS if gemm.kind == ATTENTION_KIND else gemm.layer_type
        entry = summary.setdefault(key, {"gemms": [], "flops": 0.0})
        entry["gemms"].append(gemm)
        entry["flops"] += gemm.flops
    for entry in summary.values():
        entry["speedup"] = {}
        for fmt, gpu in _speedup_columns(report):
            bf16 = sum(report.time(g, "bf16", gpu) for g in entry["gemms"])
            low = [report.time(g, fmt, gpu) for g in entry["gemms"]]
            entry["speedup"][(fmt, gpu.name)] = None if any(t is None for t in low) else bf16 / sum(low)
    return summary


def render(report: Report) -> str:
    cfg = report.cfg
    counts = {symbol: cfg.pattern.count(symbol) for symbol in "M*-"}
    linear_flops = sum(g.flops for g in report.gemms if g.kind != ATTENTION_KIND)
    bmm_flops = sum(g.flops for g in report.gemms if g.kind == ATTENTION_KIND)
    listed = linear_flops + bmm_flops
    lines = [
        f"GEMMs of one training step (forward + backward): model {cfg.name}, {report.tokens} tokens per micro-batch "
        f"(sequences of {report.seq_len}), {cfg.num_blocks} blocks ({counts['M']} Mamba, {counts['*']} attention, "
        f"{counts['-']} MLP)",
        f"Step model FLOPs (models.flops, the MFU numerator): {report.step_flops / 1e12:.2f} TFLOP = linears "
        f"{linear_flops / 1e12:.2f} + attention BMMs {bmm_flops / 1e12:.2f} (causal, half counted) + SSD scan estimate "
        f"{(report.step_flops - listed) / 1e12:.2f} (not a GEMM)",
        f"{len(report.gemms)} GEMMs: {sum(1 for g in report.gemms if g.kind != ATTENTION_KIND) // 3} linears x "
        f"(Fprop, Dgrad, Wgrad) + {sum(1 for g in report.gemms if g.kind == ATTENTION_KIND)} attention BMMs (BF16).",
        f"Speedup over BF16 = modelled t_bf16 / t_format from dense datasheet peaks and HBM bandwidth "
        f"(trainer/hardware.py), quantization traffic overhead: {report.overhead}. '-': no native GEMM in that format.",
    ]
    if report.plan is not None:
        lines.append(
            f"Precision recipe {report.recipe_name!r} ({report.recipe_format}): column 'plan' is the format each GEMM "
            f"runs in under it (models.quant.recipe.plan_layers)."
        )
    columns = _speedup_columns(report)

    # Table 1: one row per distinct GEMM (identical blocks grouped).
    header = ["layer type", "kind", "M", "N", "K", "count", "GFLOP each", "% step"]
    if report.plan is not None:
        header.append("plan")
    header += [_column_label(fmt, gpu) for fmt, gpu in columns]
    rows = []
    for (layer_type, kind, m, n, k, batch, planned), members in group_gemms(report).items():
        first = members[0]
        shape_m = f"{m}" if batch == 1 else f"{batch}x{m}"
        row = [layer_type, kind, shape_m, n, k, len(members), f"{first.flops / 1e9:.1f}",
               f"{100 * first.flops * len(members) / report.step_flops:.2f}"]
        if report.plan is not None:
            row.append(planned)
        for fmt, gpu in columns:
            row.append("bf16" if not first.quantizable else _fmt_speedup(report.speedup(first, fmt, gpu)))
        rows.append(row)
    lines += ["", "Per GEMM (identical GEMMs of repeated blocks on one row; 'count' of them; attention M = batch x s):"]
    lines += ["  " + line for line in _table(header, rows, align_left=2)]

    # Table 2: per layer type.
    header = ["layer type", "layers", "% step FLOPs"] + [_column_label(fmt, gpu) for fmt, gpu in columns]
    rows = []
    for layer_type, entry in layer_type_summary(report).items():
        layers = len({g.layer for g in entry["gemms"]}) if layer_type == ATTENTION_BMMS else len({g.name for g in entry["gemms"]})
        rows.append([layer_type, layers, f"{100 * entry['flops'] / report.step_flops:.2f}"]
                    + [_fmt_speedup(entry["speedup"][(fmt, gpu.name)]) for fmt, gpu in columns])
    lines += ["", "Per layer type (Fprop + Dgrad + Wgrad of all its layers; attention BMMs and lm_head stay BF16):"]
    lines += ["  " + line for line in _table(header, rows)]

    # Table 3: the whole step's GEMMs per GPU.
    header = ["GPU", "BF16 ms"]
    for fmt in report.formats:
        header += [f"{fmt.upper()} ms", f"{fmt.upper()} x", f"{fmt.upper()} quant %"]
    if report.plan is not None:
        header += [f"recipe {report.recipe_name} ms", "recipe x"]
    rows = []
    for gpu in report.gpus:
        bf16 = step_time(report, gpu, None)
        row = [gpu.name, _ms(bf16)]
        for fmt in report.formats:
            low = step_time(report, gpu, fmt)
            share = quantization_share(report, gpu, fmt)
            row += [_ms(low), _fmt_speedup(None if low is None else bf16 / low),
                    "-" if share is None else f"{100 * share:.0f}"]
        if report.plan is not None:
            planned = step_time(report, gpu, None, use_plan=True)
            row += [_ms(planned), _fmt_speedup(None if planned is None else bf16 / planned)]
        rows.append(row)
    lines += ["", "Whole step, all GEMMs (every block linear in the format; lm_head and attention BMMs BF16; "
                  "'quant %': share of the time spent quantizing):"]
    lines += ["  " + line for line in _table(header, rows)]
    if report.measured is not None:
        lines += ["", *render_measured(report)]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ CSV
def csv_rows(report: Report) -> List[dict]:
    """One dict per GEMM: shape, FLOPs, share, planned format, modelled times and speedups, measurements."""
    rows = []
    for gemm in report.gemms:
        row = {
            "name": gemm.name, "layer": "" if gemm.layer is None else gemm.layer, "layer_type": gemm.layer_type,
            "kind": gemm.kind, "operation": gemm.operation, "M": gemm.M, "N": gemm.N, "K": gemm.K,
            "batch": gemm.batch, "causal": gemm.causal, "quantizable": gemm.quantizable, "flops": int(gemm.flops),
            "share_of_step_flops": gemm.flops / report.step_flops,
        }
        if report.plan is not None:
            row["plan_format"] = report.planned_format(gemm)
        for gpu in report.gpus:
            row[f"bf16_us_{gpu.name}"] = 1e6 * report.time(gemm, "bf16", gpu)
            for fmt in report.formats:
                effective = fmt if gemm.quantizable else "bf16"
                timing = report.gemm_time(gemm, effective, gpu)
                row[f"{fmt}_us_{gpu.name}"] = "" if timing is None else 1e6 * timing.total
                row[f"{fmt}_quant_us_{gpu.name}"] = "" if timing is None else 1e6 * timing.quantization
                value = report.speedup(gemm, fmt, gpu)
                row[f"{fmt}_speedup_{gpu.name}"] = "" if value is None else value
        if report.measured is not None:
            measured = report.measured.get((gemm.M, gemm.N, gemm.K, gemm.kind), {})
            for variant in MEASURE_VARIANTS:
                value = measured.get(variant, "")
                row[f"measured_{variant}_us"] = 1e6 * value if isinstance(value, float) else value
        rows.append(row)
    return rows


def write_csv(report: Report, path: Path) -> None:
    rows = csv_rows(report)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


# ------------------------------------------------------------------------------------ --measure
MEASURE_VARIANTS = ("bf16", "fp8_tensorwise", "fp8_blockwise", "mxfp8", "nvfp4")


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def _gemm_operands(variant: str, m: int, n: int, k: int, kind: str, device):
    """(callable running C = A B once, description) for one variant; raises if the shape does not fit."""
    import torch

    if variant == "bf16":
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, k, device=device, dtype=torch.bfloat16).t()  # [K, N], column-major like a Linear weight
        return lambda: torch.matmul(a, b)
    # All scaled variants: A [M, K] row-major, B [K, N] column-major (cuBLAS's TN layout).
    if variant in ("fp8_tensorwise", "fp8_blockwise", "mxfp8"):
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()
    if variant == "fp8_tensorwise":
        one = torch.ones((), device=device, dtype=torch.float32)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    if variant == "fp8_blockwise":
        if k % 128 or m % 128 or n % 128:
            raise ValueError(f"blockwise FP8 needs M, N, K multiples of 128, got {m}x{n}x{k}")
        # scale_a: 1x128 blocks of A, shape [M, K/128], "outer-dim-major" (stride (1, M)).
        scale_a = torch.ones(k // 128, m, device=device).t()
        if kind == "wgrad":
            # Both operands 1x128 along tokens: scale_b [K/128, N] row-major (its transpose is outer-dim-major).
            scale_b = torch.ones(k // 128, n, device=device)
        else:
            # B is a weight in 128x128 tiles: scale_b [K/128, N/128], the transpose of a row-major [N/128, K/128].
            scale_b = torch.ones(n // 128, k // 128, device=device).t()
        return lambda: torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
    if variant == "mxfp8":
        # E8M0 scales, one per 1x32 block, in cuBLAS's swizzled layout: round_up(rows,128) x round_up(K/32,4) bytes.
        code_one = 127  # E8M0 code of 2^0
        scale_a = torch.full((_round_up(m, 128) * _round_up(k // 32, 4),), code_one, device=device, dtype=torch.uint8)
        scale_b = torch.full((_round_up(n, 128) * _round_up(k // 32, 4),), code_one, device=device, dtype=torch.uint8)
        scale_a, scale_b = scale_a.view(torch.float8_e8m0fnu), scale_b.view(torch.float8_e8m0fnu)
        return lambda: torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
    if variant == "nvfp4":
        # Two E2M1 codes per byte: A [M, K/2], B [N, K/2] -> its transpose [K/2, N] column-major.
        a = torch.randint(0, 256, (m, k // 2), device=device, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
        b = torch.randint(0, 256, (n, k // 2), device=device, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).t()
        scale_a = torch.ones(_round_up(m, 128) * _round_up(k // 16, 4), device=device).to(torch.float8_e4m3fn)
        scale_b = torch.ones(_round_up(n, 128) * _round_up(k // 16, 4), device=device).to(torch.float8_e4m3fn)
        return lambda: torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
    raise ValueError(f"unknown variant {variant!r}")


def _variant_available(variant: str, capability) -> Optional[str]:
    """None if worth trying on this GPU, else why not."""
    if variant == "bf16":
        return None
    if capability < (8, 9):
        return "needs compute capability >= 8.9"
    if variant in ("mxfp8", "nvfp4") and capability < (10, 0):
        return "needs compute capability >= 10.0 (Blackwell)"
    return None


def time_callable(run, warmup: int, iters: int) -> float:
    """Median seconds of ``run()`` over ``iters`` timed launches (CUDA events), after ``warmup`` launches."""
    import torch

    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for start, end in zip(starts, ends):
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in zip(starts, ends)) / 1e3


def measure(report: Report, warmup: int = 5, iters: int = 20, variants: Sequence[str] = MEASURE_VARIANTS) -> None:
    """Time every distinct linear GEMM (M, N, K, kind) on the present CUDA GPU; fills ``report.measured``."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("--measure needs a CUDA GPU (torch.cuda.is_available() is False); run without --measure "
                           "for the theoretical report")
    device = torch.device("cuda")
    capability = torch.cuda.get_device_capability(device)
    report.measured = {}
    shapes = OrderedDict()
    for gemm in report.gemms:
        if gemm.kind != ATTENTION_KIND:
            shapes.setdefault((gemm.M, gemm.N, gemm.K, gemm.kind), gemm)
    for key in shapes:
        m, n, k, kind = key
        results: Dict[str, object] = {}
        for variant in variants:
            reason = _variant_available(variant, capability)
            if reason is not None:
                results[variant] = f"unsupported: {reason}"
                continue
            try:
                run = _gemm_operands(variant, m, n, k, kind, device)
                results[variant] = time_callable(run, warmup, iters)
            except (RuntimeError, ValueError, TypeError, NotImplementedError, AttributeError) as error:
                message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                results[variant] = f"unsupported: {message[:160]}"
            finally:
                run = None
                torch.cuda.empty_cache()
        report.measured[key] = results
        print(f"  measured {kind} {m}x{n}x{k}: " + ", ".join(
            f"{v} {1e3 * t:.3f} ms" if isinstance(t, float) else f"{v} -" for v, t in results.items()), flush=True)


def render_measured(report: Report) -> List[str]:
    import torch

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "this GPU"
    flops_of = {}
    counts: Dict[tuple, int] = {}
    for gemm in report.gemms:
        if gemm.kind != ATTENTION_KIND:
            key = (gemm.M, gemm.N, gemm.K, gemm.kind)
            flops_of[key] = gemm.flops
            counts[key] = counts.get(key, 0) + 1
    header = ["kind", "M", "N", "K", "count"] + [f"{v} ms (TFLOP/s)" for v in MEASURE_VARIANTS] + [
        f"{v} x" for v in MEASURE_VARIANTS[1:]]
    rows = []
    totals = {variant: 0.0 for variant in MEASURE_VARIANTS}
    complete = {variant: True for variant in MEASURE_VARIANTS}
    for key, results in report.measured.items():
        m, n, k, kind = key
        row = [kind, m, n, k, counts[key]]
        for variant in MEASURE_VARIANTS:
            value = results.get(variant)
            if isinstance(value, float):
                row.append(f"{1e3 * value:.3f} ({flops_of[key] / value / 1e12:.0f})")
                totals[variant] += value * counts[key]
            else:
                row.append("-")
                complete[variant] = False
        base = results.get("bf16")
        for variant in MEASURE_VARIANTS[1:]:
            value = results.get(variant)
            row.append(f"{base / value:.2f}" if isinstance(value, float) and isinstance(base, float) else "-")
        rows.append(row)
    lines = [f"Measured on {name} (CUDA events, median; linear GEMMs only, GEMM kernels only, no quantization):"]
    lines += ["  " + line for line in _table(header, rows)]
    for variant in MEASURE_VARIANTS:
        if complete[variant] and totals[variant] > 0:
            ratio = totals["bf16"] / totals[variant] if complete["bf16"] else float("nan")
            lines.append(f"  all linear GEMMs in {variant}: {1e3 * totals[variant]:.1f} ms per micro-batch "
                         f"({ratio:.2f}x BF16)")
    unsupported = {f"{v}: {r}" for results in report.measured.values() for v, r in results.items() if isinstance(r, str)}
    lines += [f"  not measured - {entry}" for entry in sorted(unsupported)]
    return lines


# ------------------------------------------------------------------------------------ CLI
def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="model config: a name under configs/model/ or a yaml path")
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per micro-batch (default 8192)")
    parser.add_argument("--seq-len", type=int, default=None, help="sequence length (default: --tokens)")
    parser.add_argument("--precision", default=None,
                        help="precision recipe (configs/precision/ name or yaml): mark the GEMMs it keeps in BF16")
    parser.add_argument("--formats", default=",".join(DEFAULT_FORMATS),
                        help=f"comma-separated formats to compare with BF16 (default {','.join(DEFAULT_FORMATS)}; "
                             f"also: fp8_tensor, mxfp4)")
    parser.add_argument("--gpus", default=",".join(GPUS), help=f"comma-separated GPUs (default {','.join(GPUS)})")
    parser.add_argument("--overhead", choices=OVERHEAD_MODES, default="sum",
                        help="how quantization traffic adds to GEMM time (default sum)")
    parser.add_argument("--csv", type=Path, default=None, help="write every GEMM (one row each) to this CSV")
    parser.add_argument("--measure", action="store_true", help="time each distinct linear GEMM on this CUDA GPU")
    parser.add_argument("--warmup", type=int, default=5, help="--measure: warm-up launches per GEMM")
    parser.add_argument("--iters", type=int, default=20, help="--measure: timed launches per GEMM (median)")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Report:
    args = parse_args(argv)
    cfg = load_model_config(args.config)
    precision = load_precision_config(args.precision) if args.precision else None
    report = build_report(
        cfg, tokens=args.tokens, seq_len=args.seq_len, precision=precision,
        gpus=[g.strip() for g in args.gpus.split(",") if g.strip()],
        formats=[f.strip() for f in args.formats.split(",") if f.strip()], overhead=args.overhead,
    )
    if args.measure:
        measure(report, warmup=args.warmup, iters=args.iters)
    print(render(report))
    if args.csv is not None:
        write_csv(report, args.csv)
        print(f"\nwrote {len(report.gemms)} GEMMs to {args.csv}")
    return report


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        raise SystemExit(f"gemm_report: {error}") from None
