"""Every GEMM of a training step, its FLOPs, and what each low-precision format buys on each GPU.

`build_report(model_config, tokens, seq_len, precision, gpus, formats, overhead)` lists the GEMMs
of one micro-batch (models.gemms: Fprop, Dgrad, Wgrad of every linear; attention BMMs, always
BF16) with the modelled time of each in each format (trainer.planning.gemm_costs). With a precision
recipe the report marks which GEMMs that recipe keeps in BF16 (first/last pattern symbols,
lm_head, globs, GEMMs the recipe leaves unquantized) exactly as the trainer's precision pass
(models.quant.recipe.plan_layers) decides, and adds the step speedup of the recipe.
`render` gives the printed tables, `write_csv` one row per GEMM, `measure` fills in the GEMM
kernel times of the present GPU (benchmarks.gemm_timing). `python -m reports.gemm_report` (this package's
__main__) is its command line.
"""

from __future__ import annotations

import csv
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from benchmarks.gemm_timing import MEASURE_VARIANTS, measure_gemm_shapes
from models.config import ModelConfig
from models.flops import flops_breakdown
from models.gemms import ATTENTION_KIND, Gemm, training_gemms
from trainer.planning.gemm_costs import (
    DEFAULT_FORMATS, FORMAT_COSTS, OVERHEAD_MODES, RECIPE_FORMATS, FormatCost, GemmTime, costs_for_recipe, gemm_time,
    peak_rate, recipe_gemm_formats, speedup,
)
from trainer.config import compose_option
from trainer.hardware import GPUS, GpuSpec


# ------------------------------------------------------------------------------------ configs
def load_model_config(name_or_path: str) -> ModelConfig:
    """ModelConfig of configs/model/<name>.yaml or a yaml path, composed as the trainer composes it."""
    return compose_option("model", name_or_path).model.validate()


def load_precision_config(name_or_path: str):
    """PrecisionConfig of configs/precision/<name>.yaml or a yaml path (unknown keys fail, naming them)."""
    return compose_option("precision", name_or_path).precision


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


# ------------------------------------------------------------------------------------ measurements
def measure(report: Report, warmup: int = 5, iters: int = 20, variants: Sequence[str] = MEASURE_VARIANTS) -> None:
    """Time every distinct linear GEMM (M, N, K, kind) on the present CUDA GPU; fills ``report.measured``."""
    shapes = OrderedDict()
    for gemm in report.gemms:
        if gemm.kind != ATTENTION_KIND:
            shapes.setdefault((gemm.M, gemm.N, gemm.K, gemm.kind), gemm)
    report.measured = measure_gemm_shapes(shapes, warmup, iters, variants)


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
