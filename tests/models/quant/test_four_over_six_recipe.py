"""Four Over Six in the recipe: config fields, which operands it reaches, the plan, and the layer's GEMMs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from models import build_model
from models.config import ModelConfig
from models.quant.config import PrecisionConfig
from models.quant.format_registry import FORMAT_SPECS, format_spec
from models.quant.gemm_spec import nvfp4_linear_spec
from models.quant.linear import QuantLinear
from models.quant.recipe import apply_precision, validate_config

import quant_oracles as oracle

OPERANDS = {"fprop.a": "x", "fprop.b": "w", "dgrad.a": "dy", "dgrad.b": "w", "wgrad.a": "dy", "wgrad.b": "x"}


def _choices(spec) -> dict:
    return {name: getattr(getattr(spec, name.split(".")[0]), name.split(".")[1]).four_over_six for name in OPERANDS}


def test_nvfp4_4over6_is_the_full_recipe_with_every_operand_choosing():
    cfg = PrecisionConfig(name="nvfp4_4over6", format="nvfp4_4over6")
    spec = format_spec("nvfp4_4over6").linear_spec(cfg)
    plain = format_spec("nvfp4").linear_spec(PrecisionConfig(name="nvfp4", format="nvfp4"))
    assert set(_choices(spec).values()) == {"mse"}
    for gemm in ("fprop", "dgrad", "wgrad"):
        for side in ("a", "b"):
            ours, theirs = getattr(getattr(spec, gemm), side), getattr(getattr(plain, gemm), side)
            assert dataclasses.replace(ours, four_over_six=None) == theirs  # only the choice differs
    assert "4/6-MSE" in spec.describe() and "4/6" not in plain.describe()


@pytest.mark.parametrize("roles", [["w"], ["x", "dy"], ["dy"]])
def test_roles_pick_exactly_their_operands(roles):
    cfg = PrecisionConfig(name="nvfp4", format="nvfp4", four_over_six=roles, four_over_six_error="mae")
    choices = _choices(format_spec("nvfp4").linear_spec(cfg))
    assert choices == {name: ("mae" if role in roles else None) for name, role in OPERANDS.items()}


@pytest.mark.parametrize("fields, message", [
    (dict(four_over_six=["w", "z"]), "names operand roles"),
    (dict(format="mxfp4", four_over_six=["w"]), "applies to the formats"),
    (dict(four_over_six_error="l2"), "four_over_six_error must be one of"),
])
def test_bad_config_is_named(fields, message):
    with pytest.raises(ValueError, match=message):
        validate_config(dataclasses.replace(PrecisionConfig(name="nvfp4", format="nvfp4"), **fields))


def test_te_backend_refuses_four_over_six():
    """TE's 4over6 recipe runs without RHT and SR; this recipe has both, so it runs emulated only."""
    assert FORMAT_SPECS["nvfp4_4over6"].te_recipe is None
    with pytest.raises(ValueError, match="backend=emulated"):
        FORMAT_SPECS["nvfp4"].te_recipe_options(PrecisionConfig(format="nvfp4", four_over_six=["w"]))


def test_the_plan_shows_the_quantized_operands():
    model_cfg = ModelConfig(pattern="M-", vocab_size=64, hidden_size=64, ffn_hidden_size=128, mamba_num_heads=4,
                            mamba_head_dim=32, ssm_state_size=16, mamba_num_groups=1, chunk_size=16)
    model = build_model(model_cfg)
    cfg = PrecisionConfig(name="nvfp4_4over6", format="nvfp4_4over6", backend="emulated", bf16_layers_at_start=0,
                          keep_indivisible_in_bf16=True)
    plan = apply_precision(model, cfg)
    text = plan.render()
    assert "recipe nvfp4_4over6 (nvfp4_4over6)" in text
    assert "fprop: nvfp4 1x16 RNE+4/6-MSE x nvfp4 16x16 RNE+4/6-MSE" in text
    assert "wgrad: nvfp4 1x16 SR+RHT+4/6-MSE x nvfp4 1x16 RNE+RHT+4/6-MSE" in text


def test_layer_gemms_use_the_four_over_six_operands():
    """Y, dX and dW of a QuantLinear (RNE, no RHT) from the brute-force oracle's dequantized operands."""
    torch.manual_seed(0)
    spec = nvfp4_linear_spec(wgrad_rht=False, stochastic_rounding=False, four_over_six=("x", "w", "dy"))
    module = QuantLinear(64, 48, bias=False, dtype=torch.float32, spec=spec, name="layers.0.mixer.in_proj")
    x = oracle.fresh_input(32, 64, 1.0, torch.float32).requires_grad_(True)
    dy = oracle.fresh_input(32, 48, 0.01, torch.float32)
    y = module(x)
    y.backward(dy)

    def dequantized(t, tile=(1, 16)):
        out = oracle.four_over_six(oracle.to_numpy_f32(t.detach().contiguous()), tile, "mse")
        return torch.from_numpy((out["scaled"] * out["decode"]).astype(np.float32))

    w = module.weight.detach()
    w_hat = dequantized(w, (16, 16))
    assert torch.equal(y.detach(), dequantized(x) @ w_hat.T)
    assert torch.equal(x.grad, dequantized(dy) @ w_hat)  # Dgrad takes Fprop's W
    assert torch.equal(module.weight.grad, dequantized(dy.T) @ dequantized(x.T).T)
    # Without the Fprop GEMM (the late switch), Dgrad quantizes W again: W's own tiles, transposed.
    module.spec = dataclasses.replace(spec, fprop=None)
    x.grad = None
    module(x).backward(dy)
    assert torch.equal(x.grad, dequantized(dy) @ w_hat)


def test_diagnostics_measure_the_four_over_six_quantization():
    """The per-operand diagnostics quantize as the spec says: Four Over Six's error is its own, lower than
    NVFP4's here, and no block scale saturates (the map-to-4 scales stay below 448 under the bound 256)."""
    from models.quant.diagnostics import quantization_diagnostics

    torch.manual_seed(0)
    x = oracle.fresh_input(256, 256, 1.0, torch.float32)
    chosen = quantization_diagnostics(x, "nvfp4", four_over_six="mse")
    plain = quantization_diagnostics(x, "nvfp4")
    expected = (torch.linalg.vector_norm(torch.from_numpy(dequantized_oracle(x)) - x)
                / torch.linalg.vector_norm(x)).item()
    assert chosen["rel_error"] == pytest.approx(expected, rel=1e-6) and chosen["rel_error"] < plain["rel_error"]
    assert chosen["scale_saturated"] == 0


def dequantized_oracle(x: torch.Tensor) -> np.ndarray:
    out = oracle.four_over_six(oracle.to_numpy_f32(x), (1, 16), "mse")
    return (out["scaled"] * out["decode"]).astype(np.float32)
