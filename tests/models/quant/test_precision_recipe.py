"""The precision pass: which linears stay BF16, what each GEMM runs, backends and the TE mapping."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn

from models import build_model
from models.config import ModelConfig
from models.quant import te_backend
from models.quant.config import PrecisionConfig
from models.quant.formats import fake_quantize
from models.quant.linear import QuantLinear
from models.quant.recipe import apply_precision, plan_layers, resolve_backend

PATTERN_12B = "M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-"


def load_model_yaml(name: str) -> ModelConfig:
    from pathlib import Path

    from omegaconf import OmegaConf

    path = Path(__file__).resolve().parents[3] / "configs" / "model" / f"{name}.yaml"
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(path)))


def load_precision_yaml(name: str, **overrides) -> PrecisionConfig:
    from pathlib import Path

    from omegaconf import OmegaConf

    path = Path(__file__).resolve().parents[3] / "configs" / "precision" / f"{name}.yaml"
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(PrecisionConfig), OmegaConf.load(path)))
    return dataclasses.replace(cfg, **overrides)


def test_12b_nvfp4_plan_keeps_first_2_and_last_8_symbols_in_bf16():
    cfg = load_model_yaml("hybrid_12b")
    assert cfg.pattern == PATTERN_12B
    with torch.device("meta"):
        model = build_model(cfg)
    layers = plan_layers(model, load_precision_yaml("nvfp4"))
    bf16_blocks = {layer.block_index for layer in layers if not layer.quantized and layer.block_index is not None}
    assert bf16_blocks == {0, 1, 54, 55, 56, 57, 58, 59, 60, 61}
    for layer in layers:
        if layer.name == "lm_head":
            assert not layer.quantized
        elif layer.block_index in bf16_blocks:
            assert set(layer.gemm_formats.values()) == {"bf16"}, layer
        else:
            assert set(layer.gemm_formats.values()) == {"nvfp4"}, layer
    # 2 + 8 symbols: "M-" (4 linears) and "M-M-M-M-" (16 linears) = 20 of 136 block linears
    # (14.7% by count); by parameters and FLOPs 1.89B of 10.96B = 17%: the paper's "~16%".
    block = [layer for layer in layers if layer.name != "lm_head"]
    assert len(block) == 136 and sum(not layer.quantized for layer in block) == 20
    bf16_params = sum(l.in_features * l.out_features for l in block if not l.quantized)
    share = bf16_params / sum(l.in_features * l.out_features for l in block)
    assert 0.16 < share < 0.18


def test_fp8_plan_keeps_first_1_and_last_2_symbols():
    with torch.device("meta"):
        model = build_model(load_model_yaml("hybrid_12b"))
    layers = plan_layers(model, load_precision_yaml("fp8"))
    bf16_blocks = {l.block_index for l in layers if not l.quantized and l.block_index is not None}
    assert bf16_blocks == {0, 60, 61}


def test_globs_and_gemm_switches():
    with torch.device("meta"):
        model = build_model(load_model_yaml("tiny"))
    cfg = load_precision_yaml("nvfp4", bf16_layers_at_start=0, bf16_layers_at_end=0,
                              bf16_layer_globs=["layers.*.mixer.o_proj"], quantize_wgrad=False)
    by_name = {layer.name: layer for layer in plan_layers(model, cfg)}
    assert not by_name["layers.3.mixer.o_proj"].quantized
    assert by_name["layers.3.mixer.q_proj"].gemm_formats == {"fprop": "nvfp4", "dgrad": "nvfp4", "wgrad": "bf16"}


def test_indivisible_layer_is_refused_by_name_or_kept_in_bf16_when_asked():
    config = dataclasses.replace(load_model_yaml("tiny"), hidden_size=72)  # 72 % 16 != 0
    with torch.device("meta"):
        model = build_model(config)
    cfg = load_precision_yaml("nvfp4", bf16_layers_at_start=0, bf16_layers_at_end=0)
    with pytest.raises(ValueError, match=r"layers\.0\.mixer\.in_proj.*in_features=72"):
        plan_layers(model, cfg)
    kept = plan_layers(model, dataclasses.replace(cfg, keep_indivisible_in_bf16=True))
    assert not next(l for l in kept if l.name == "layers.0.mixer.in_proj").quantized


def test_bad_recipe_values_name_the_field():
    with torch.device("meta"):
        model = build_model(load_model_yaml("tiny"))
    for field, value in (("format", "fp3"), ("backend", "cuda"), ("switch_mode", "half")):
        with pytest.raises(ValueError, match=f"precision.{field}"):
            plan_layers(model, dataclasses.replace(load_precision_yaml("nvfp4"), **{field: value}))


def test_backend_resolution_on_cpu():
    assert resolve_backend(load_precision_yaml("bf16"), torch.device("cpu")) == "none"
    assert resolve_backend(load_precision_yaml("nvfp4"), torch.device("cpu")) == "emulated"
    assert resolve_backend(load_precision_yaml("fp8"), torch.device("cpu")) == "emulated"
    with pytest.raises(RuntimeError, match="compute capability"):
        resolve_backend(load_precision_yaml("fp8", backend="torch"), torch.device("cpu"))
    with pytest.raises(RuntimeError, match=r"nvfp4 on compute capability 10\.0 or later"):
        resolve_backend(load_precision_yaml("nvfp4", backend="torch"), torch.device("cpu"))
    with pytest.raises(ValueError, match="natively, not mxfp4"):
        resolve_backend(load_precision_yaml("mxfp4", backend="torch"), torch.device("cpu"))
    if not te_backend.has_te():
        with pytest.raises(ImportError, match="pip install"):
            resolve_backend(load_precision_yaml("fp8", backend="te"), torch.device("cpu"))


@pytest.mark.parametrize("recipe, fmt, weight_tile, activation_tile", [
    ("nvfp4", "nvfp4", (16, 16), (1, 16)),
    ("fp8", "fp8_block", (128, 128), (1, 128)),
])
def test_emulated_layers_give_the_numerics_of_models_quant_in_every_gemm(recipe, fmt, weight_tile, activation_tile):
    """Forward and both backward GEMMs of a converted layer equal fake_quantize-then-matmul (RNE paths)."""
    size = 128
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Module()])
    model.layers[0].symbol = "-"
    model.layers[0].mixer = nn.Module()
    model.layers[0].mixer.up_proj = nn.Linear(size, 2 * size, bias=False)
    cfg = load_precision_yaml(recipe, bf16_layers_at_start=0, bf16_layers_at_end=0, gradient_stochastic_rounding=False,
                              wgrad_rht=False)
    plan = apply_precision(model, cfg, device=torch.device("cpu"))
    layer = model.layers[0].mixer.up_proj
    assert isinstance(layer, QuantLinear) and plan.backend == "emulated"
    x = torch.randn(128, size, requires_grad=True)
    grad_out = torch.randn(128, 2 * size)
    y = layer(x)
    y.backward(grad_out)
    # Independent composition of the formats: each operand quantized along its GEMM's reduction dim.
    w_hat = fake_quantize(layer.weight.detach(), fmt, tile=weight_tile)
    expected_y = fake_quantize(x.detach(), fmt, tile=activation_tile) @ w_hat.t()
    expected_dx = fake_quantize(grad_out, fmt, tile=activation_tile) @ w_hat
    expected_dw = (fake_quantize(grad_out.t().contiguous(), fmt, tile=activation_tile)
                   @ fake_quantize(x.detach().t().contiguous(), fmt, tile=activation_tile).t())
    torch.testing.assert_close(y, expected_y, rtol=0, atol=0)
    torch.testing.assert_close(x.grad, expected_dx, rtol=0, atol=0)
    torch.testing.assert_close(layer.weight.grad, expected_dw, rtol=0, atol=0)


def test_te_recipe_mapping_is_pure():
    nvfp4 = load_precision_yaml("nvfp4")
    assert te_backend.recipe_spec(nvfp4) == ("NVFP4BlockScaling", {
        "disable_rht": False, "disable_stochastic_rounding": False, "disable_2d_quantization": False})
    ablation = dataclasses.replace(nvfp4, wgrad_rht=False, weight_2d=False, gradient_stochastic_rounding=False)
    assert te_backend.recipe_spec(ablation)[1] == {
        "disable_rht": True, "disable_stochastic_rounding": True, "disable_2d_quantization": True}
    assert te_backend.recipe_spec(load_precision_yaml("fp8")) == ("Float8BlockScaling", {"power_2_scale": True})
    assert te_backend.recipe_spec(load_precision_yaml("mxfp8"))[0] == "MXFP8BlockScaling"
    forward_only = dataclasses.replace(nvfp4, quantize_dgrad=False, quantize_wgrad=False)
    assert te_backend.recipe_spec(forward_only)[1]["backward_override"] == "high_precision"
    with pytest.raises(ValueError, match="no training recipe for mxfp4"):
        te_backend.recipe_spec(load_precision_yaml("mxfp4"))
    with pytest.raises(ValueError, match="Dgrad and Wgrad together"):
        te_backend.recipe_spec(dataclasses.replace(nvfp4, quantize_wgrad=False))


def test_te_support_by_compute_capability():
    nvfp4, fp8 = load_precision_yaml("nvfp4"), load_precision_yaml("fp8")
    assert "10.0" in te_backend.supported_reason(nvfp4, (9, 0))  # Hopper: NVFP4 refused, clearly
    assert te_backend.supported_reason(nvfp4, (10, 0)) is None
    assert te_backend.supported_reason(fp8, (9, 0)) is None
    assert "CUDA" in te_backend.supported_reason(fp8, None)


def test_plan_render_lists_every_linear_and_shares():
    with torch.device("meta"):
        model = build_model(load_model_yaml("tiny"))
    plan = apply_precision(model, load_precision_yaml("nvfp4", bf16_layers_at_start=0, bf16_layers_at_end=1),
                           device=torch.device("meta"))
    text = plan.render()
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            assert name in text
    summary = plan.summary()
    assert summary["bf16_linear_layers"] == 2  # the last block is an MLP: up_proj, down_proj
    assert abs(sum(summary["flop_share_by_format"].values()) - 1) < 1e-9


def test_quantize_lm_head_gives_the_output_projection_the_recipe_and_changes_nothing_else():
    model = build_model(load_model_yaml("tiny"))
    cfg = load_precision_yaml("nvfp4")
    default = {layer.name: layer for layer in plan_layers(model, cfg)}
    with_head = {layer.name: layer for layer in plan_layers(model, dataclasses.replace(cfg, quantize_lm_head=True))}
    assert not default["lm_head"].quantized
    assert with_head["lm_head"].gemm_formats == {"fprop": "nvfp4", "dgrad": "nvfp4", "wgrad": "nvfp4"}
    assert {n: l.gemm_formats for n, l in default.items() if n != "lm_head"} == \
        {n: l.gemm_formats for n, l in with_head.items() if n != "lm_head"}
    plan = apply_precision(model, dataclasses.replace(cfg, quantize_lm_head=True), device=torch.device("cpu"))
    assert type(model.lm_head).__name__ != "Linear" and plan.layers[-1].name == "lm_head"
    logits = model(torch.randint(0, model.config.vocab_size, (1, 16)))
    assert logits.shape[-1] == model.config.vocab_size and torch.isfinite(logits).all()


def test_te_weight_adoption_keeps_the_parameter_and_what_te_attached():
    """te_backend._adopt_weight on a stand-in with TE's register_parameter override (TE itself is a GPU test)."""

    class InitMeta:
        def __init__(self, init_fn=None):
            self.init_fn = init_fn

    class TeLikeLinear(nn.Module):
        def __init__(self):
            super().__init__()
            self.param_init_meta = {}
            self.register_parameter("weight", nn.Parameter(torch.zeros(4, 8)), init_fn="te_init")
            self.weight.partition_dim = 1  # what TE's set_tensor_model_parallel_attributes sets

        def register_parameter(self, name, param, **kwargs):  # TE's override: resets the meta
            super().register_parameter(name, param)
            self.param_init_meta[name] = InitMeta(**kwargs)

    module = TeLikeLinear()
    weight = nn.Parameter(torch.randn(4, 8))
    te_backend._adopt_weight(module, weight)
    assert module.weight is weight and module.weight.partition_dim == 1
    assert module.param_init_meta["weight"].init_fn == "te_init"
    assert list(dict(module.named_parameters())) == ["weight"]
    with pytest.raises(ValueError, match=r"float32 \[4, 8\].*float32 \[8, 4\]"):
        te_backend._adopt_weight(TeLikeLinear(), nn.Parameter(torch.randn(8, 4)))
