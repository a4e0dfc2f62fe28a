"""Transformer Engine backend: te.Linear modules under te.autocast(recipe=...).

The one import site of Transformer Engine. `recipe_spec` maps our PrecisionConfig to a TE
recipe class and its arguments as plain data (a pure function, tested without TE), reading the
format's ``te_recipe`` / ``te_recipe_options`` / ``native["te"]`` in models.quant.format_registry:

  nvfp4       NVFP4BlockScaling(disable_rht=not wgrad_rht,
                                disable_stochastic_rounding=not gradient_stochastic_rounding,
                                disable_2d_quantization=not weight_2d)
  fp8_block   Float8BlockScaling()  with QParams(power_2_scale=fp8_power_of_two_scales) for
              inputs, weights and gradients (TE's default is power-of-two scales)
  mxfp8       MXFP8BlockScaling()
  fp8_tensor  Float8CurrentScaling(fp8_format=E4M3)
  mxfp4       not a TE training recipe: refused
Backward GEMMs in high precision (quantize_dgrad = quantize_wgrad = false) map to
backward_override='high_precision'; TE cannot quantize Dgrad and not Wgrad (or the reverse),
nor keep Fprop alone in BF16: those combinations are refused with the reason.

Hardware (measured with TE 2.20.2 on the H200): FP8 recipes run
on compute capability 9.0; NVFP4 and MXFP8 need 10.0 (Blackwell) and TE refuses them earlier.
Layers kept in BF16 stay plain nn.Linear, outside TE's reach, so the autocast around the whole
model leaves them untouched.
"""

from __future__ import annotations

import importlib.util
from typing import Dict, List, Optional, Tuple

import torch.nn as nn

from models.quant.config import PrecisionConfig
from models.quant.format_registry import FORMAT_SPECS

INSTALL_HINT = "pip install --no-build-isolation 'transformer-engine[pytorch]'  (or: pip install -e '.[te]')"


def has_te() -> bool:
    """True when transformer_engine.pytorch imports (not merely when the package is present)."""
    if importlib.util.find_spec("transformer_engine") is None:
        return False
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken install counts as absent
        return False
    return True


def require_te() -> None:
    if not has_te():
        raise ImportError(f"precision.backend=te needs Transformer Engine, which does not import here. Install: {INSTALL_HINT}")


def supported_reason(cfg: PrecisionConfig, capability: Optional[Tuple[int, int]]) -> Optional[str]:
    """None when TE can run this recipe on this GPU; otherwise why not."""
    if capability is None:
        return "Transformer Engine needs a CUDA GPU"
    spec = FORMAT_SPECS.get(cfg.format)
    if spec is None or spec.te_recipe is None:
        return f"Transformer Engine has no training recipe for {cfg.format}"
    needed = spec.native["te"].minimum
    if not spec.runs_natively("te", capability):
        return (f"TE's {cfg.format} recipe needs compute capability {needed[0]}.{needed[1]}+ "
                f"(this GPU is {capability[0]}.{capability[1]}); on Hopper use backend=emulated"
                + (" or backend=torch" if cfg.format.startswith("fp8") else ""))
    try:
        recipe_spec(cfg)
    except ValueError as error:
        return str(error)
    return None


def check_supported(cfg: PrecisionConfig, capability: Optional[Tuple[int, int]]) -> None:
    reason = supported_reason(cfg, capability)
    if reason is not None:
        raise RuntimeError(f"precision.backend=te: {reason}")


def recipe_spec(cfg: PrecisionConfig) -> Tuple[str, Dict[str, object]]:
    """(TE recipe class name, keyword arguments) for this config. Pure; no TE import."""
    kwargs: Dict[str, object] = {}
    if not cfg.quantize_fprop:
        raise ValueError("TE cannot keep Fprop in BF16 while quantizing the backward GEMMs")
    if cfg.quantize_dgrad != cfg.quantize_wgrad:
        raise ValueError("TE quantizes Dgrad and Wgrad together (backward_override applies to both)")
    if not cfg.quantize_dgrad:
        kwargs["backward_override"] = "high_precision"
    spec = FORMAT_SPECS.get(cfg.format)
    if spec is None or spec.te_recipe is None:
        raise ValueError(f"Transformer Engine has no training recipe for {cfg.format}")
    kwargs.update(spec.te_recipe_options(cfg))
    return spec.te_recipe, kwargs


def build_recipe(cfg: PrecisionConfig):
    """Instantiate the TE recipe of `recipe_spec`."""
    from transformer_engine.common import recipe as te_recipe

    name, kwargs = recipe_spec(cfg)
    kwargs = dict(kwargs)
    power_2_scale = kwargs.pop("power_2_scale", None)
    if "fp8_format" in kwargs:
        kwargs["fp8_format"] = getattr(te_recipe.Format, kwargs["fp8_format"])
    recipe = getattr(te_recipe, name)(**kwargs)
    if power_2_scale is not None:
        params = te_recipe.QParams(power_2_scale=power_2_scale, amax_epsilon=0.0)
        recipe.fp8_quant_fwd_inp = params
        recipe.fp8_quant_fwd_weight = params
        recipe.fp8_quant_bwd_grad = params
    return recipe


class TeAutocast:
    """The autocast around the model's forward; `enabled=False` is the late switch to BF16."""

    def __init__(self, recipe):
        self.recipe = recipe
        self.enabled = True

    def __call__(self):
        import transformer_engine.pytorch as te

        return te.autocast(enabled=self.enabled, recipe=self.recipe)


def convert(model: nn.Module, names: List[str], cfg: PrecisionConfig):
    """Swap the named nn.Linears for te.Linear (the same weight Parameters) and wrap forward in te.autocast.

    Why this path is not a ``QuantizedLinear`` and differs from the other backends:
    - TE's GEMMs, quantizers and workspaces live inside ``te.Linear`` (its forward is TE's own
      autograd function, driven by the recipe of the enclosing ``te.autocast``), so the layer must
      be TE's module, not a subclass of ours; the late switch and the step live in ``TeAutocast``.
    - The weight is adopted, as the other backends adopt it: the te.Linear is built (TE registers
      its own Parameter, with init metadata and tensor-parallel attributes set on the object), then
      the nn.Linear's Parameter takes its place, carrying over the attributes TE set on its own and
      TE's init metadata (``param_init_meta``, which nn.Module's attribute assignment would
      otherwise reset through TE's ``register_parameter``). The model keeps the very Parameter
      objects it was built with, so references taken before the conversion stay live.
    - ``model.forward`` is wrapped because TE wants one ``te.autocast`` region around the whole
      forward (the backward reuses the recipe captured there) and nn.Module has no hook that
      encloses a forward: a pre-hook/post-hook pair would leave TE's global autocast state entered
      when the forward raises, and an autocast per layer changes TE's grouping. The wrapper is an
      instance attribute, so the class, the state dict and ``model.layers`` are untouched.
    """
    require_te()
    import transformer_engine.pytorch as te

    modules = {}
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        linear = getattr(parent, child)
        if linear.bias is not None:
            raise ValueError(f"layer '{name}': the te backend conversion expects bias-free linears")
        replacement = te.Linear(linear.in_features, linear.out_features, bias=False,
                                params_dtype=linear.weight.dtype, device=linear.weight.device)
        _adopt_weight(replacement, linear.weight)
        setattr(parent, child, replacement)
        modules[name] = replacement

    autocast = TeAutocast(build_recipe(cfg))
    plain_forward = model.forward

    def forward_under_te_autocast(*args, **kwargs):
        with autocast():
            return plain_forward(*args, **kwargs)

    model.forward = forward_under_te_autocast
    return modules, autocast


def _adopt_weight(module: nn.Module, weight: nn.Parameter) -> None:
    """Make ``weight`` the te.Linear's Parameter, keeping what TE attached to its own."""
    own = module.weight
    if own.shape != weight.shape or own.dtype != weight.dtype or own.device != weight.device:
        raise ValueError(f"te.Linear's weight is {own.dtype} {list(own.shape)} on {own.device}, "
                         f"the adopted one {weight.dtype} {list(weight.shape)} on {weight.device}")
    init_meta = getattr(module, "param_init_meta", {}).get("weight")
    for attribute, value in vars(own).items():  # e.g. tensor_model_parallel, partition_dim
        if not hasattr(weight, attribute):
            setattr(weight, attribute, value)
    module.weight = weight  # nn.Module.__setattr__ -> TE's register_parameter
    if init_meta is not None:
        module.param_init_meta["weight"] = init_meta
