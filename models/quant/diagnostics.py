"""Quantization diagnostics: how much a tensor loses when quantized, and which layers lose most.

For a tensor x (an operand of one GEMM, blocks along its last dim = the GEMM's reduction dim) and
its quantize-dequantize x_hat = models.quant.formats.quantize(x, fmt, ...).dequantize():

    rel_error           ||x - x_hat||_2 / ||x||_2                      (0 for an all-zero x)
    flushed_to_zero     #{x_i != 0 and x_hat_i == 0} / #{x_i != 0}
    saturated_elements  #{|x_i| > elem_max * d_b} / numel, d_b the block's full decode scale
                        (block scale x tensor scale): values clipped to the largest element
    scale_saturated     share of blocks whose scale, before it is stored, exceeds the scale format:
                          nvfp4      block_amax * (S_enc * 1/6) > 448 (E4M3 max), beyond fp32 rounding
                                     (the block holding the tensor amax lands on 448 up to one ulp)
                          mx         floor(log2 block_amax) - emax_elem > 127 (E8M0 max)
                          fp8_*      448 / amax overflows fp32 (TE then uses the dtype max)
    scale_underflow     share of nonzero blocks whose scale underflows the scale format:
                          nvfp4      the E4M3 scale rounds to 0 (block_amax * S_enc / 6 < 2^-10), so
                                     the whole block decodes to 0
                          mx         the ideal exponent is below -127 (E8M0 min) and is clamped: the
                                     elements lose their low bits or flush
                          fp8_*      never (fp32 scales)
    scale_subnormal     nvfp4 only: share of nonzero blocks whose E4M3 scale is subnormal
                        (0 < s_b < 2^-6): fewer than 4 significant bits of scale
    amax                max |x| of the whole input tensor (before any RHT)

All arithmetic is fp32 under no_grad. Large tensors are measured on a sample of whole row groups
(blocks are never cut): evenly spaced groups plus the group holding the largest |value| (after the
RHT when one is applied), so the sample's amax equals the tensor's and the per-tensor scale of
nvfp4 / fp8_tensor is the one the full tensor gets; per-block numbers on the sample are then exact
for the sampled blocks, and rel_error / shares are estimates over them.

Per layer: ``DiagnosticsRecorder`` registers forward hooks on the quantized linear modules (those
that quantize something: models.quant.quantized_linear.QuantizedLinear, emulated or torch FP8)
and, while armed, keeps a small sample of each module's input X and output gradient dY (whole groups
of 128 tokens, the group with the largest |value| included). ``collect_layer_diagnostics`` then
measures, per GEMM the layer's spec quantizes, both operands in the orientation and with the tile,
rounding and RHT that GEMM uses:

    fprop  X [T, K],  W [N, K]        dgrad  dY [T, N],  W^T [K, N]     wgrad  dY^T [N, T],  X^T [K, T]

(W^T is skipped when Dgrad reuses Fprop's quantized W.) Stochastic rounding draws from a private
generator, never from the training RNG. ``summarize`` ranks layers by how far their worst operand's
error sits above the median of the same operand over all layers, and flags flush-to-zero and scale
underflow: the candidates to keep in BF16.

Recorder caveats: the hooks run Python on armed steps only (one amax pass per tensor); under
torch.compile they are traced into the graph (arming then triggers a recompile), under activation
checkpointing the forward hook runs again in the recomputation (same values). With RHT in the
token orientation (wgrad) the sample's amax is the pre-transform one, so its per-tensor scale is an
approximation. Under FSDP2 the weight is the local shard (``to_local()``): its amax is the shard's.
"""

from __future__ import annotations

import contextlib
import statistics
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

import torch
import torch.nn as nn

from models.quant import formats
from models.quant.format_registry import format_spec
from models.quant.quantized_linear import QuantizedLinear
from models.quant.rht import rht as random_hadamard_transform

DEFAULT_MAX_ELEMENTS = 1 << 20
"""Elements measured per tensor at most (larger tensors are sampled by row groups)."""
TOKEN_GROUP = 128
"""Tokens per sampled group: a multiple of every block length along tokens (16, 32, 128)."""
E4M3_MIN_NORMAL = 2.0**-6
UE5M3_MIN_NORMAL = 2.0**-14
_SATURATION_TOLERANCE = 1.0 + 2.0**-20  # |x| above elem_max * d_b by more than fp32 rounding of the product
_ROW_AMAX_CHUNK = 1 << 22  # elements per chunk when scanning rows for the amax (bounds the temporary)


# ------------------------------------------------------------------------------------ one tensor
def _element_max(fmt: str) -> float:
    return format_spec(fmt).element_max


def _row_amax(x2d: torch.Tensor, rht: bool) -> torch.Tensor:
    """max |x| of each row (of rht(x) when ``rht``), fp32 [rows], in chunks of rows."""
    rows, cols = x2d.shape
    step = max(1, _ROW_AMAX_CHUNK // max(cols, 1))
    parts = []
    for start in range(0, rows, step):
        chunk = x2d[start : start + step]
        if rht:
            chunk = random_hadamard_transform(chunk)
        parts.append(chunk.float().abs().amax(dim=1))
    return torch.cat(parts)


def sample_row_groups(row_amax: torch.Tensor, group: int, max_rows: int) -> Optional[torch.Tensor]:
    """Indices of whole groups of ``group`` rows: evenly spaced ones plus the group of the largest row.

    None when everything fits in ``max_rows`` (no sampling). ``row_amax`` [rows] picks the maximum.
    """
    rows = row_amax.numel()
    if rows <= max_rows or rows % group != 0:
        return None
    groups = rows // group
    keep = max(1, max_rows // group)
    if keep >= groups:
        return None
    chosen = set(torch.linspace(0, groups - 1, steps=max(keep - 1, 1)).round().long().tolist()) if keep > 1 else set()
    chosen.add(int(torch.argmax(row_amax).item()) // group)
    starts = torch.tensor(sorted(chosen), dtype=torch.long, device=row_amax.device) * group
    return (starts[:, None] + torch.arange(group, device=row_amax.device)).reshape(-1)


def _blocked(x2d: torch.Tensor, tile) -> torch.Tensor:
    """[R, C] -> [R/tr, tr, C/tc, tc] (one block for a per-tensor format)."""
    rows, cols = x2d.shape
    if tile is None:
        return x2d.reshape(1, rows, 1, cols)
    return x2d.reshape(rows // tile[0], tile[0], cols // tile[1], tile[1])


@torch.no_grad()
def quantization_diagnostics(
    x: torch.Tensor,
    fmt: str,
    *,
    rht: bool = False,
    max_elements: Optional[int] = DEFAULT_MAX_ELEMENTS,
    name: Optional[str] = None,
    **quantize_options,
) -> dict:
    """Error, flush-to-zero, saturation and underflow of quantizing ``x`` to ``fmt`` (see the module docstring).

    ``quantize_options``: ``formats.quantize``'s keywords (tile, rounding, generator,
    power_of_two_scales), passed through unchanged; the quantization measured is exactly that call's.
    ``x``: any shape, blocks along the last dim (the GEMM's reduction dim). ``rht``: apply the 16x16
    random Hadamard transform along the last dim first (as NVFP4's Wgrad does); the error is then
    measured in the transformed space, which is the same (the transform is orthogonal).
    ``max_elements``: sample whole row groups above this many elements (None: never sample).
    """
    tile = quantize_options["tile"] = formats.resolve_tile(fmt, quantize_options.get("tile"))
    formats.check_blockable(x.shape, fmt, tile, name=name)
    x2d = x.detach().reshape(-1, x.shape[-1])
    amax = x2d.float().abs().amax()
    group = 1 if tile is None else tile[0]
    sampled_rows = None
    if max_elements is not None and x2d.numel() > max_elements:
        row_amax = _row_amax(x2d, rht)
        sampled_rows = sample_row_groups(row_amax, group, max(group, max_elements // x2d.shape[1]))
    sample = x2d if sampled_rows is None else x2d[sampled_rows]
    if rht:
        sample = random_hadamard_transform(sample, name=name)
    quantized = formats.quantize(sample, fmt, name=name, **quantize_options)
    values = sample.float()
    restored = quantized.dequantize(torch.float32)

    norm = torch.linalg.vector_norm(values)
    error = torch.linalg.vector_norm(values - restored)
    nonzero = values != 0
    flushed = nonzero & (restored == 0)

    blocked = _blocked(values.abs(), tile)
    block_amax = blocked.amax(dim=(1, 3))  # [R/tr, C/tc]
    block_decode = quantized.block_scales_fp32()[:, 0, :, 0] if quantized.block_scales is not None else (
        torch.ones_like(block_amax))
    full_decode = block_decode * (quantized.tensor_scale if quantized.tensor_scale is not None else 1.0)
    largest = (_element_max(fmt) * full_decode)[:, None, :, None] * _SATURATION_TOLERANCE
    saturated_elements = (blocked > largest) & (block_decode[:, None, :, None] > 0)

    nonzero_block = block_amax > 0
    subnormal = torch.zeros_like(nonzero_block)
    if fmt in ("nvfp4", "nvfp4_ue5m3"):
        # scale_bound: 448 (256 with Four Over Six, whose map-to-4 scales stay below 448), 114688 for UE5M3
        encode, _ = formats.nvfp4_global_scales(values.abs().amax(), quantized.scale_bound)
        unclamped = block_amax * (encode * torch.tensor(1.0 / formats.E2M1_MAX, dtype=torch.float32, device=values.device))
        largest_scale, smallest_normal = ((formats.UE5M3_MAX, UE5M3_MIN_NORMAL) if fmt == "nvfp4_ue5m3"
                                          else (formats.E4M3_MAX, E4M3_MIN_NORMAL))
        scale_saturated = unclamped > largest_scale * _SATURATION_TOLERANCE  # not the fp32 rounding at amax
        stored = quantized.block_scales.float()
        underflow = nonzero_block & (stored == 0)
        subnormal = nonzero_block & (stored > 0) & (stored < smallest_normal)
    elif fmt in ("mxfp4", "mxfp8"):
        _, exponent = torch.frexp(block_amax)
        unbiased = exponent - 1 - formats.MX_ELEMENT_EMAX[fmt]
        scale_saturated = nonzero_block & (unbiased > formats.E8M0_BIAS)
        underflow = nonzero_block & (unbiased < -formats.E8M0_BIAS)
    else:  # fp8_block, fp8_tensor: fp32 scale 448 / amax
        scale_saturated = nonzero_block & torch.isinf(formats.E4M3_MAX / block_amax)
        underflow = torch.zeros_like(nonzero_block)

    nonzero_blocks = nonzero_block.sum().clamp(min=1)
    stats = torch.stack([
        torch.where(norm > 0, error / norm, torch.zeros_like(norm)),
        flushed.sum() / nonzero.sum().clamp(min=1),
        saturated_elements.sum() / values.numel(),
        scale_saturated.float().mean(),
        underflow.sum() / nonzero_blocks,
        subnormal.sum() / nonzero_blocks,
        1.0 - nonzero.float().mean(),
        values.abs().amax(),
    ]).tolist()
    return {
        "fmt": fmt,
        "tile": tile,
        "rounding": quantize_options.get("rounding", "nearest"),
        "rht": rht,
        "rel_error": stats[0],
        "flushed_to_zero": stats[1],
        "saturated_elements": stats[2],
        "scale_saturated": stats[3],
        "scale_underflow": stats[4],
        "scale_subnormal": stats[5],
        "zero_share": stats[6],
        "amax": float(amax),
        "measured_amax": stats[7],
        "numel": x2d.numel(),
        "measured_numel": values.numel(),
        "sampled": sampled_rows is not None,
        "blocks": block_amax.numel(),
    }


# ------------------------------------------------------------------------------------ per layer
def quantized_spec(module: nn.Module):
    """The module's LinearSpec if it is a QuantizedLinear (emulated or torch FP8) that quantizes a GEMM, else None."""
    if not isinstance(module, QuantizedLinear) or not module.spec.quantized:
        return None
    return module.spec


_WRAPPER_PARTS = ("_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module", "module")


def clean_module_name(qualified: str) -> str:
    """'layers.3._checkpoint_wrapped_module.mixer.in_proj' -> 'layers.3.mixer.in_proj' (wrapper parts dropped)."""
    return ".".join(part for part in qualified.split(".") if part not in _WRAPPER_PARTS)


def _module_name(qualified: str, module: nn.Module) -> str:
    return getattr(module, "name", "") or clean_module_name(qualified)


class DiagnosticsRecorder:
    """Keeps, while armed, a sample of each quantized linear's input X and output gradient dY.

    Usage (the trainer, every N steps):
        recorder = DiagnosticsRecorder(model)          # once, after the precision pass
        with recorder.recording():                     # around one training step
            loss.backward()  ...
        records = collect_layer_diagnostics(model, recorder)
        recorder.clear()

    ``samples[name] = {"input": Tensor[t, K], "grad_output": Tensor[t', N]}`` (flattened tokens, whole
    groups of ``TOKEN_GROUP`` tokens when the token count divides, the group with the largest |value|
    always included; at most ``sample_tokens`` tokens plus that group).
    """

    def __init__(self, model: nn.Module, *, sample_tokens: int = 2 * TOKEN_GROUP):
        if sample_tokens < 1:
            raise ValueError(f"DiagnosticsRecorder: sample_tokens must be >= 1, got {sample_tokens}")
        self.sample_tokens = sample_tokens
        self.armed = False
        self.samples: Dict[str, Dict[str, torch.Tensor]] = {}
        self._handles = []
        for qualified, module in model.named_modules():
            if quantized_spec(module) is not None:
                name = _module_name(qualified, module)
                self._handles.append(module.register_forward_hook(self._forward_hook(name)))
        self.modules = len(self._handles)

    def _sample(self, tensor: torch.Tensor) -> torch.Tensor:
        flat = tensor.detach().reshape(-1, tensor.shape[-1])
        tokens = flat.shape[0]
        group = next((g for g in (TOKEN_GROUP, 32, 16) if tokens % g == 0), 1)
        rows = sample_row_groups(flat.abs().amax(dim=1), group, max(group, self.sample_tokens))
        return flat.clone() if rows is None else flat[rows]

    def _forward_hook(self, name: str):
        def hook(module, inputs, output):
            if not self.armed:
                return
            entry = self.samples.setdefault(name, {})
            operand = inputs[0]
            if torch.is_autocast_enabled(operand.device.type):  # the GEMM sees autocast's dtype
                operand = operand.to(torch.get_autocast_dtype(operand.device.type))
            entry["input"] = self._sample(operand)
            if isinstance(output, torch.Tensor) and output.requires_grad:

                def store_gradient(grad):
                    entry["grad_output"] = self._sample(grad)

                output.register_hook(store_gradient)

        return hook

    def arm(self) -> None:
        self.armed = True

    def disarm(self) -> None:
        self.armed = False

    @contextlib.contextmanager
    def recording(self):
        """Arm for the duration of the block (one forward + backward)."""
        self.arm()
        try:
            yield self
        finally:
            self.disarm()

    def clear(self) -> None:
        self.samples.clear()

    def remove(self) -> None:
        """Remove the hooks (the recorder records nothing afterwards)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.armed = False


def _local(weight: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2), else the tensor itself."""
    to_local = getattr(weight, "to_local", None)
    return to_local() if callable(to_local) else weight


def _operand_record(layer: str, gemm: str, operand: str, tensor: torch.Tensor, spec, generator, max_elements) -> dict:
    record = {"layer": layer, "gemm": gemm, "operand": operand}
    try:
        record.update(quantization_diagnostics(
            tensor, spec.fmt, tile=spec.tile, rounding=spec.rounding, generator=generator,
            power_of_two_scales=getattr(spec, "power_of_two_scales", True), rht=getattr(spec, "rht", False),
            four_over_six=getattr(spec, "four_over_six", None), max_elements=max_elements,
            name=f"{layer} ({gemm} {operand})",
        ))
    except (ValueError, TypeError) as error:  # e.g. a sample whose token count does not divide the block
        record["error"] = str(error)
    return record


@torch.no_grad()
def collect_layer_diagnostics(
    model: nn.Module,
    recorder: Optional[DiagnosticsRecorder] = None,
    *,
    weights: bool = True,
    max_elements: Optional[int] = DEFAULT_MAX_ELEMENTS,
    specs: Optional[Mapping[str, object]] = None,
    seed: int = 0,
) -> List[dict]:
    """One record per (quantized layer, GEMM, operand): the layer's spec decides format, tile, rounding, RHT.

    Operands from ``recorder`` (X, dY) are measured when it holds them; weights when ``weights``.
    ``specs`` maps layer names to a LinearSpec for modules without one (e.g. a TE module). A record
    with an ``error`` key says why an operand could not be measured (shape not divisible by the block).
    """
    records: List[dict] = []
    samples = recorder.samples if recorder is not None else {}
    for qualified, module in model.named_modules():
        name = _module_name(qualified, module)
        spec = specs.get(name) if specs is not None and name in specs else quantized_spec(module)
        if spec is None or not getattr(spec, "quantized", False):
            continue
        weight = _local(module.weight.detach())
        sample = samples.get(name, {})
        x, dy = sample.get("input"), sample.get("grad_output")
        generator = torch.Generator(device=weight.device)
        generator.manual_seed(seed)
        operands = {
            "fprop": (("X", x), ("W", weight if weights else None)),
            "dgrad": (("dY", dy), ("W^T", weight.t() if weights else None)),
            "wgrad": (("dY^T", None if dy is None else dy.t()), ("X^T", None if x is None else x.t())),
        }
        reuses_weight = bool(getattr(spec, "reuses_forward_weight", False))
        for gemm, pair in operands.items():
            gemm_spec = getattr(spec, gemm, None)
            if gemm_spec is None:
                continue
            for (operand, tensor), operand_spec in zip(pair, (gemm_spec.a, gemm_spec.b)):
                if tensor is None or (gemm == "dgrad" and operand == "W^T" and reuses_weight):
                    continue
                records.append(_operand_record(name, gemm, operand, tensor, operand_spec, generator, max_elements))
    return records


# ------------------------------------------------------------------------------------ summaries
def summarize(
    diagnostics: Sequence[dict],
    *,
    error_ratio: float = 1.5,
    flush_ratio: float = 2.0,
    flush_floor: float = 0.01,
    underflow_threshold: float = 0.01,
) -> List[dict]:
    """Layers ranked by how much they would rather stay in BF16, worst first.

    score = max over the layer's operands of rel_error / (median rel_error of the same GEMM operand
    over all layers). ``bf16_candidate`` is set when score > ``error_ratio``; or an operand flushes
    more than ``flush_ratio`` x the median flush share of that operand (and more than ``flush_floor``;
    NVFP4 flushes several % of Gaussian values by design, so only outliers count); or more than
    ``underflow_threshold`` of its blocks' scales underflow or saturate. Records with an ``error``
    are listed in ``errors``.
    """
    measured = [d for d in diagnostics if "error" not in d]
    by_operand: Dict[tuple, List[dict]] = {}
    for d in measured:
        by_operand.setdefault((d["gemm"], d["operand"]), []).append(d)
    medians = {key: statistics.median(d["rel_error"] for d in group) for key, group in by_operand.items()}
    flush_medians = {key: statistics.median(d["flushed_to_zero"] for d in group) for key, group in by_operand.items()}

    layers: Dict[str, dict] = {}
    for d in diagnostics:
        entry = layers.setdefault(d["layer"], {
            "layer": d["layer"], "score": 0.0, "worst_operand": None, "worst_rel_error": 0.0,
            "max_flushed_to_zero": 0.0, "max_scale_underflow": 0.0, "max_scale_saturated": 0.0,
            "reasons": [], "errors": [],
        })
        label = f"{d['gemm']}.{d['operand']}"
        if "error" in d:
            entry["errors"].append(f"{label}: {d['error']}")
            continue
        median = medians[(d["gemm"], d["operand"])]
        ratio = d["rel_error"] / median if median > 0 else (1.0 if d["rel_error"] == 0 else float("inf"))
        if ratio > entry["score"]:
            entry.update(score=ratio, worst_operand=label, worst_rel_error=d["rel_error"])
        entry["max_flushed_to_zero"] = max(entry["max_flushed_to_zero"], d["flushed_to_zero"])
        entry["max_scale_underflow"] = max(entry["max_scale_underflow"], d["scale_underflow"])
        entry["max_scale_saturated"] = max(entry["max_scale_saturated"], d["scale_saturated"])
        flush_median = flush_medians[(d["gemm"], d["operand"])]
        if d["flushed_to_zero"] > max(flush_floor, flush_ratio * flush_median):
            entry["reasons"].append(f"{label} flushes {100 * d['flushed_to_zero']:.1f}% of its nonzero values to zero "
                                    f"(median of that operand {100 * flush_median:.1f}%)")
        if d["scale_underflow"] > underflow_threshold:
            entry["reasons"].append(f"{label}: {100 * d['scale_underflow']:.1f}% of block scales underflow to zero")
        if d["scale_saturated"] > underflow_threshold:
            entry["reasons"].append(f"{label}: {100 * d['scale_saturated']:.1f}% of block scales saturate")
    for entry in layers.values():
        if entry["score"] > error_ratio:
            entry["reasons"].insert(0, f"{entry['worst_operand']} error {entry['worst_rel_error']:.4f} is "
                                       f"{entry['score']:.2f}x the median of that operand")
        entry["bf16_candidate"] = bool(entry["reasons"])
    return sorted(layers.values(), key=lambda e: (e["bf16_candidate"], e["score"]), reverse=True)


METRIC_KEYS = ("rel_error", "flushed_to_zero", "saturated_elements", "scale_saturated", "scale_underflow", "amax")


def flatten_for_logging(diagnostics: Iterable[dict], prefix: str = "quant") -> Dict[str, float]:
    """{'quant/<layer>/<gemm>.<operand>/<metric>': value}: W&B groups panels by the layer's section."""
    flat = {}
    for d in diagnostics:
        if "error" in d:
            continue
        for key in METRIC_KEYS:
            flat[f"{prefix}/{d['layer']}/{d['gemm']}.{d['operand']}/{key}"] = d[key]
    return flat


def render_summary(ranked: Sequence[dict], top: int = 10) -> str:
    """A few lines for the console: the worst layers and why."""
    lines = [f"Quantization diagnostics: {sum(e['bf16_candidate'] for e in ranked)} of {len(ranked)} layers flagged"]
    for entry in ranked[:top]:
        flag = "BF16?" if entry["bf16_candidate"] else "     "
        why = "; ".join(entry["reasons"]) or "-"
        lines.append(f"  {flag} {entry['layer']}: score {entry['score']:.2f} (worst {entry['worst_operand']}, "
                     f"rel error {entry['worst_rel_error']:.4f}); {why}")
        lines.extend(f"        not measured: {error}" for error in entry["errors"])
    return "\n".join(lines)
