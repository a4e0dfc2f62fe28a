"""The precision pass: decide each linear layer's format per GEMM, then swap the modules.

`apply_precision(model, cfg)` runs once on the built model, before activation checkpointing,
compile and FSDP. It:
  1. plans every nn.Linear by its fully qualified name (`plan_layers`, pure, meta-safe):
     - `lm_head` stays BF16 (the paper keeps the output projection in BF16) unless
       `quantize_lm_head`, which gives it the recipe's format like a block linear;
     - blocks among the first `bf16_layers_at_start` or last `bf16_layers_at_end` pattern
       symbols stay BF16 (a symbol counts as one layer, as Megatron's
       --num-layers-at-start-in-bf16 / --num-layers-at-end-in-bf16 count it);
     - names matching `bf16_layer_globs` stay BF16;
     - every other linear gets the recipe's format in each GEMM (Fprop, Dgrad, Wgrad) that
       the config quantizes; a linear whose dims do not divide the format's block size is an
       error naming the layer (or BF16 when `keep_indivisible_in_bf16`);
  2. resolves the backend (`auto` -> te where TE runs this recipe on this GPU and the linears are not
     split by tensor parallelism, else torch where torch runs the format natively: FP8 on Hopper, NVFP4
     on Blackwell; else emulated) and swaps modules: QuantLinear (emulated), the torch FP8 or NVFP4
     linear, or te.Linear under te.autocast;
  3. returns a `PrecisionPlan` that prints the table, reports FLOP shares, advances the
     stochastic-rounding step and performs the late switch to BF16 (paper, Appendix D).
Embeddings, norms, conv1d, the SSD scan and attention's softmax BMMs are not linears and stay
in BF16/FP32 (they are listed in the plan's notes, not its rows).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
import torch.nn as nn

from models.quant.config import PrecisionConfig
from models.quant.format_registry import BACKENDS, FORMAT_SPECS, GEMMS, RECIPE_FORMATS, format_spec
from models.quant.formats import FOUR_OVER_SIX_ERRORS
from models.quant.gemm_spec import FOUR_OVER_SIX_ROLES

FOUR_OVER_SIX_RECIPES = ("nvfp4", "nvfp4_4over6")
"""The recipe formats that read precision.four_over_six."""

_BLOCK_NAME = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass
class LayerPlan:
    """One linear layer's precision: format per GEMM (or 'bf16'), backend, and why."""

    name: str
    in_features: int
    out_features: int
    block_index: Optional[int]
    symbol: Optional[str]
    gemm_formats: Dict[str, str]
    reason: str
    backend: str = "bf16"

    @property
    def quantized(self) -> bool:
        return any(fmt != "bf16" for fmt in self.gemm_formats.values())

    @property
    def flops_per_token(self) -> int:
        """Fprop + Dgrad + Wgrad, 2 * in * out each."""
        return 6 * self.in_features * self.out_features


@dataclass
class PrecisionPlan:
    """The outcome of the pass; lives for the run (late switch, SR step, reporting)."""

    cfg: PrecisionConfig
    layers: List[LayerPlan]
    backend: str
    modules: Dict[str, nn.Module] = field(default_factory=dict)  # quantized modules by name
    notes: List[str] = field(default_factory=list)
    switched: bool = False
    te_autocast: Optional[object] = None  # te backend: the switch flips its `enabled`

    # ------------------------------------------------------------------ reporting
    def summary(self) -> dict:
        linears = [layer for layer in self.layers if layer.name != "lm_head"]
        total_flops = sum(layer.flops_per_token for layer in self.layers) or 1
        flops_by_format: Dict[str, float] = {}
        for layer in self.layers:
            for gemm in GEMMS:
                fmt = layer.gemm_formats[gemm]
                flops_by_format[fmt] = flops_by_format.get(fmt, 0) + layer.flops_per_token / 3
        bf16_block_linears = [layer for layer in linears if not layer.quantized]
        block_flops = sum(layer.flops_per_token for layer in linears) or 1
        return {
            "recipe": self.cfg.name,
            "format": self.cfg.format,
            "backend": self.backend,
            "linear_layers": len(linears),
            "bf16_linear_layers": len(bf16_block_linears),
            "bf16_linear_share_by_count": len(bf16_block_linears) / max(len(linears), 1),
            "bf16_linear_share_by_flops": sum(l.flops_per_token for l in bf16_block_linears) / block_flops,
            "flop_share_by_format": {fmt: value / total_flops for fmt, value in sorted(flops_by_format.items())},
            "switched_to_bf16": self.switched,
        }

    def render(self) -> str:
        """The plan as a table: one row per linear, then the FLOP shares."""
        rows = [("layer", "shape (out x in)", "fprop", "dgrad", "wgrad", "backend", "why")]
        for layer in self.layers:
            rows.append((layer.name, f"{layer.out_features} x {layer.in_features}",
                         layer.gemm_formats["fprop"], layer.gemm_formats["dgrad"], layer.gemm_formats["wgrad"],
                         layer.backend, layer.reason))
        widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
        lines = [f"Precision plan: recipe {self.cfg.name} ({self.cfg.format}), backend {self.backend}"]
        for index, row in enumerate(rows):
            lines.append("  " + "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)))
            if index == 0:
                lines.append("  " + "  ".join("-" * width for width in widths))
        s = self.summary()
        shares = ", ".join(f"{fmt} {100 * share:.1f}%" for fmt, share in s["flop_share_by_format"].items())
        lines.append(f"  linear GEMM FLOPs by format (lm_head included): {shares}")
        lines.append(
            f"  block linears kept in BF16: {s['bf16_linear_layers']} of {s['linear_layers']} "
            f"({100 * s['bf16_linear_share_by_count']:.1f}% by count, "
            f"{100 * s['bf16_linear_share_by_flops']:.1f}% by FLOPs)"
        )
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)

    # ------------------------------------------------------------------ during training
    def quantized_linears(self) -> list:
        """The converted layers that hold their own spec and step state (QuantizedLinear).

        None for the te backend: its te.Linear modules take their recipe from the one te.autocast
        around the model's forward (``te_autocast``), which the late switch turns off.
        """
        return [] if self.te_autocast is not None else list(self.modules.values())

    def set_micro_step(self, micro_step: int) -> None:
        """Each layer's stochastic-rounding seed for micro-batch ``micro_step`` of the current step."""
        for module in self.quantized_linears():
            module.set_micro_step(micro_step)

    def set_step(self, step: int) -> None:
        """Re-seed each layer's stochastic rounding from (seed, layer, step, rank), micro-batch 0.

        Every draw is then a function of the step, so a resumed run rounds exactly as an
        uninterrupted one, and data-parallel ranks (different data) draw independently.
        """
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        for module in self.quantized_linears():
            module.set_step(step, rank)

    def maybe_switch(self, step: int, tokens: int) -> Optional[dict]:
        """Late switch to BF16 (paper, App. D) once step/tokens reach the configured point."""
        cfg = self.cfg
        if self.switched or not self.modules and self.te_autocast is None:
            return None
        due = (cfg.switch_to_bf16_at_step is not None and step >= cfg.switch_to_bf16_at_step) or (
            cfg.switch_to_bf16_at_tokens is not None and tokens >= cfg.switch_to_bf16_at_tokens
        )
        if not due:
            return None
        self.switch_to_bf16(cfg.switch_mode)
        return {"mode": cfg.switch_mode, "layers": len(self.modules)}

    def switch_to_bf16(self, mode: str) -> None:
        if mode not in ("forward", "forward_backward"):
            raise ValueError(f"precision.switch_mode must be 'forward' or 'forward_backward'; got {mode!r}")
        gemms = ("fprop",) if mode == "forward" else GEMMS
        if self.te_autocast is not None:
            # TE's autocast covers all three GEMMs of a layer at once: the switch is total.
            self.te_autocast.enabled = False
            gemms = GEMMS
        for module in self.quantized_linears():
            module.set_high_precision(gemms)
        for layer in self.layers:
            if layer.name in self.modules:
                for gemm in gemms:
                    layer.gemm_formats[gemm] = "bf16"
        self.switched = True

    def state_dict(self) -> dict:
        return {"switched": self.switched}

    def load_state_dict(self, state: dict) -> None:
        if state.get("switched") and not self.switched:
            self.switch_to_bf16(self.cfg.switch_mode)


# ---------------------------------------------------------------------------- planning
def validate_config(cfg: PrecisionConfig) -> None:
    if cfg.format not in RECIPE_FORMATS:
        raise ValueError(f"precision.format must be one of {', '.join(RECIPE_FORMATS)}; got {cfg.format!r}")
    if cfg.backend not in BACKENDS:
        raise ValueError(f"precision.backend must be one of {', '.join(BACKENDS)}; got {cfg.backend!r}")
    if cfg.switch_mode not in ("forward", "forward_backward"):
        raise ValueError(f"precision.switch_mode must be 'forward' or 'forward_backward'; got {cfg.switch_mode!r}")
    for name in ("bf16_layers_at_start", "bf16_layers_at_end"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"precision.{name} must be >= 0; got {getattr(cfg, name)}")
    unknown_roles = [role for role in cfg.four_over_six if role not in FOUR_OVER_SIX_ROLES]
    if unknown_roles:
        raise ValueError(f"precision.four_over_six names operand roles of {FOUR_OVER_SIX_ROLES}; got {unknown_roles}")
    if cfg.four_over_six and cfg.format not in FOUR_OVER_SIX_RECIPES:
        raise ValueError(f"precision.four_over_six applies to the formats {FOUR_OVER_SIX_RECIPES}, not {cfg.format!r}; "
                         "leave it empty")
    if cfg.four_over_six_error not in FOUR_OVER_SIX_ERRORS:
        raise ValueError(f"precision.four_over_six_error must be one of {FOUR_OVER_SIX_ERRORS}; "
                         f"got {cfg.four_over_six_error!r}")


def plan_layers(model: nn.Module, cfg: PrecisionConfig) -> List[LayerPlan]:
    """Decide every nn.Linear's formats. Pure: reads names and shapes only (meta-safe)."""
    validate_config(cfg)
    symbols = [block.symbol for block in model.layers]
    num_blocks = len(symbols)
    bf16_blocks = set(range(min(cfg.bf16_layers_at_start, num_blocks)))
    bf16_blocks |= set(range(max(0, num_blocks - cfg.bf16_layers_at_end), num_blocks))
    quantized_gemms = {"fprop": cfg.quantize_fprop, "dgrad": cfg.quantize_dgrad, "wgrad": cfg.quantize_wgrad}

    plans = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        match = _BLOCK_NAME.search(name)
        block_index = int(match.group(1)) if match else None
        symbol = symbols[block_index] if block_index is not None else None
        bf16 = {gemm: "bf16" for gemm in GEMMS}
        plan = LayerPlan(name, module.in_features, module.out_features, block_index, symbol, bf16, reason="")
        if cfg.format == "bf16":
            plan.reason = "recipe is bf16"
        elif name == "lm_head" and not cfg.quantize_lm_head:
            plan.reason = "output projection stays BF16"
        elif block_index is None and name != "lm_head":
            plan.reason = "outside the blocks"
        elif block_index in bf16_blocks:
            first = block_index < cfg.bf16_layers_at_start
            plan.reason = (f"first {cfg.bf16_layers_at_start} blocks in BF16" if first
                           else f"last {cfg.bf16_layers_at_end} blocks in BF16")
        elif any(fnmatch.fnmatchcase(name, glob) for glob in cfg.bf16_layer_globs):
            plan.reason = "matches precision.bf16_layer_globs"
        elif not any(quantized_gemms.values()):
            plan.reason = "no GEMM quantized"
        else:
            edge = FORMAT_SPECS[cfg.format].block_edge
            bad = [f"{dim_name}={dim}" for dim_name, dim in (("in_features", module.in_features),
                                                          ("out_features", module.out_features)) if dim % edge]
            if bad:
                if not cfg.keep_indivisible_in_bf16:
                    raise ValueError(
                        f"layer '{name}': {', '.join(bad)} not divisible by {edge}, the {cfg.format} block size. "
                        "Change the model dims, keep it in BF16 with precision.bf16_layer_globs, or set "
                        "precision.keep_indivisible_in_bf16=true."
                    )
                plan.reason = f"{', '.join(bad)} not divisible by {edge}: kept in BF16"
            else:
                plan.gemm_formats = {gemm: (cfg.format if on else "bf16") for gemm, on in quantized_gemms.items()}
                plan.reason = cfg.name
        plans.append(plan)
    return plans


# ---------------------------------------------------------------------------- backends
TE_UNDER_TP = ("precision.backend=te with parallel.tp > 1: the tensor-parallel pass shards the emulated and torch "
               "quantized linears, not Transformer Engine's; use precision.backend=auto (torch or emulated GEMMs "
               "under tensor parallelism) or parallel.tp=1")

def resolve_backend(cfg: PrecisionConfig, device: torch.device, tensor_parallel: bool = False) -> str:
    """'none' for bf16 recipes; else te | torch | emulated as the config and hardware allow.

    ``tensor_parallel``: the model's linears will be split by the tensor-parallel pass, which shards the
    project's own layers (emulated, torch) and not Transformer Engine's: auto then skips te, and te is refused.
    """
    from models.quant import te_backend

    if cfg.format == "bf16":
        return "none"
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    if cfg.backend == "emulated":
        return "emulated"
    if cfg.backend == "te" and tensor_parallel:
        raise ValueError(TE_UNDER_TP)
    if cfg.backend == "te":
        te_backend.require_te()
        te_backend.check_supported(cfg, capability)
        return "te"
    if cfg.backend == "torch":
        spec = format_spec(cfg.format)
        if "torch" not in spec.native:
            torch_formats = ", ".join(name for name, entry in FORMAT_SPECS.items() if "torch" in entry.native)
            raise ValueError(f"precision.backend=torch runs the formats {torch_formats} natively, not {cfg.format}; "
                             "use backend=emulated or te")
        if not spec.runs_natively("torch", capability):
            here = "a CPU" if capability is None else f"compute capability {capability[0]}.{capability[1]}"
            raise RuntimeError(f"precision.backend=torch runs {cfg.format} on {spec.native['torch'].describe()}; "
                               f"this device is {here}. Use precision.backend=emulated (or auto)")
        return "torch"
    # auto
    if not tensor_parallel and te_backend.has_te() and te_backend.supported_reason(cfg, capability) is None:
        return "te"
    if format_spec(cfg.format).runs_natively("torch", capability):
        return "torch"
    return "emulated"


def apply_precision(model: nn.Module, cfg: PrecisionConfig, device: Optional[torch.device] = None,
                    tensor_parallel: bool = False) -> PrecisionPlan:
    """Plan and convert the model's linears in place; returns the plan (``tensor_parallel``: resolve_backend)."""
    device = device or next(model.parameters()).device
    layers = plan_layers(model, cfg)
    backend = resolve_backend(cfg, device, tensor_parallel)
    plan = PrecisionPlan(cfg=cfg, layers=layers, backend=backend)
    plan.notes.append("embeddings, norms, conv1d, SSD scan and attention BMMs stay in BF16/FP32")
    to_convert = [layer for layer in layers if layer.quantized]
    for layer in layers:
        layer.backend = backend if layer.quantized else "bf16"
    if backend == "none" or not to_convert:
        return plan
    plan.notes.append(f"quantized operands ({to_convert[0].name}): {linear_spec(cfg, to_convert[0]).describe()}")

    if backend == "te":
        from models.quant import te_backend

        plan.modules, plan.te_autocast = te_backend.convert(model, [l.name for l in to_convert], cfg)
        plan.notes.append(f"TE recipe: {te_backend.recipe_spec(cfg)}")
        return plan

    if backend == "torch":
        linear_class = torch_linear_class(cfg.format)
        plan.notes.append(f"{linear_class.__name__}: the quantized GEMMs run natively through torch's scaled matmul")
    else:
        from models.quant.linear import QuantLinear as linear_class

        plan.notes.append("quantized GEMMs are emulated: quantize-dequantize, then a BF16/FP32 matmul "
                          "(bit-exact formats, not the low-precision speed)")
    for layer in to_convert:
        parent_name, _, child = layer.name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        converted = linear_class.from_linear(getattr(parent, child), linear_spec(cfg, layer), name=layer.name)
        converted.set_seed(cfg.seed, layer=len(plan.modules))
        setattr(parent, child, converted)
        plan.modules[layer.name] = converted
    return plan


def torch_linear_class(fmt: str):
    """The torch backend's layer for a recipe format, by the element format its operands take."""
    if format_spec(fmt).quantizes_as == "nvfp4":
        from models.quant.nvfp4_torch import TorchNvfp4Linear

        return TorchNvfp4Linear
    from models.quant.fp8_torch import TorchFp8Linear

    return TorchFp8Linear


def linear_spec(cfg: PrecisionConfig, layer: LayerPlan):
    """This layer's LinearSpec from the recipe's knobs (the registry's builder of cfg.format)."""
    on = {gemm: layer.gemm_formats[gemm] != "bf16" for gemm in GEMMS}
    return format_spec(cfg.format).linear_spec(
        cfg, quantize_fprop=on["fprop"], quantize_dgrad=on["dgrad"], quantize_wgrad=on["wgrad"]
    )
