"""The format registry: one FormatSpec per format, read everywhere; a variant added by one entry composes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
from test_precision_recipe import load_model_yaml

from models import build_model
from models.quant import formats
from models.quant import linear as quant_linear
from models.quant.config import PrecisionConfig
from models.quant.format_registry import (
    FORMAT_SPECS,
    OPERAND_FORMATS,
    RECIPE_FORMATS,
    format_spec,
)
from models.quant.gemm_spec import OperandSpec
from models.quant.linear import QuantLinear
from models.quant.recipe import apply_precision, resolve_backend
from models.quant.rht import rht


def test_every_recipe_format_builds_a_spec_whose_operands_are_registered_formats():
    assert RECIPE_FORMATS == ("bf16", *FORMAT_SPECS)
    for name, spec in FORMAT_SPECS.items():
        linear_spec = spec.linear_spec(PrecisionConfig(format=name), quantize_fprop=True, quantize_dgrad=True,
                                       quantize_wgrad=True)
        for gemm in ("fprop", "dgrad", "wgrad"):
            for operand in (getattr(linear_spec, gemm).a, getattr(linear_spec, gemm).b):
                assert operand.fmt == spec.quantizes_as in OPERAND_FORMATS, (name, gemm)
                assert spec.block_edge % (operand.tile or (1, 1))[1] == 0, "dims that divide block_edge divide the tile"


def test_cost_model_facts_are_there_for_every_format():
    nvfp4 = format_spec("nvfp4")
    assert (nvfp4.element_bytes, nvfp4.vector_block, nvfp4.weight_block, nvfp4.amax_pass) == (0.5, 16, 256, True)
    assert format_spec("fp8_block").weight_block == 128 * 128 and format_spec("mxfp8").peak_key == "mxfp8"
    with pytest.raises(ValueError, match="unknown format 'fp4'"):
        format_spec("fp4")


# ------------------------------------------------------------------------------------------------
# The variant added by one registry entry: MXFP8 with the RHT on both Wgrad operands


def test_mxfp8_wgrad_rht_composes_into_a_precision_plan():
    with torch.device("meta"):
        model = build_model(load_model_yaml("tiny"))
    model = model.to_empty(device="cpu")
    cfg = PrecisionConfig(name="mxfp8_wgrad_rht", format="mxfp8_wgrad_rht", backend="auto",
                          keep_indivisible_in_bf16=True)
    assert resolve_backend(cfg, torch.device("cpu")) == "emulated"
    plan = apply_precision(model, cfg, torch.device("cpu"))
    assert plan.modules, plan.render()
    for layer in plan.layers:
        if layer.name in plan.modules:
            assert set(layer.gemm_formats.values()) == {"mxfp8_wgrad_rht"}
            spec = plan.modules[layer.name].spec
            assert spec.wgrad.a == spec.wgrad.b == OperandSpec("mxfp8", (1, 32), rht=True)
            assert spec.fprop.a == spec.dgrad.b == OperandSpec("mxfp8", (1, 32))
    assert "mxfp8_wgrad_rht" in plan.render()


def test_mxfp8_wgrad_rht_wgrad_operands_are_rht_then_mxfp8(monkeypatch):
    """dW from RHT'd MXFP8 operands: the operands equal rht(.) of dY^T and X^T, and dW their product."""
    tokens, in_features, out_features = 64, 64, 32
    spec = FORMAT_SPECS["mxfp8_wgrad_rht"].linear_spec(PrecisionConfig(), quantize_fprop=True, quantize_dgrad=True,
                                                        quantize_wgrad=True)
    module = QuantLinear.from_linear(nn.Linear(in_features, out_features, bias=False), spec, name="blk")
    seen = {}
    original = quant_linear.formats.quantize_scaled_values

    def recording(tensor, fmt, **kwargs):
        seen[kwargs["name"]] = (tensor.clone(), fmt)
        return original(tensor, fmt, **kwargs)

    monkeypatch.setattr(quant_linear.formats, "quantize_scaled_values", recording)
    x = torch.randn(tokens, in_features, requires_grad=True)
    dy = torch.randn(tokens, out_features)
    module(x).backward(dy)

    dy_t, x_t = rht(dy.t().contiguous()), rht(x.detach().t().contiguous())
    assert seen["Wgrad dY^T"][1] == seen["Wgrad X^T"][1] == "mxfp8"
    assert torch.equal(seen["Wgrad dY^T"][0], dy_t) and torch.equal(seen["Wgrad X^T"][0], x_t)
    a_hat = formats.quantize(dy_t, "mxfp8").dequantize().double().numpy()
    b_hat = formats.quantize(x_t, "mxfp8").dequantize().double().numpy()
    np.testing.assert_allclose(module.weight.grad.double().numpy(), a_hat @ b_hat.T, rtol=1e-5, atol=1e-5)
    plain = formats.quantize(dy.t().contiguous(), "mxfp8").dequantize().double().numpy() @ \
        formats.quantize(x.detach().t().contiguous(), "mxfp8").dequantize().double().numpy().T
    assert not np.allclose(plain, a_hat @ b_hat.T, rtol=1e-5, atol=1e-5), "the RHT changes what is quantized"


def test_every_element_format_has_its_quantize_functions_and_nothing_else():
    assert set(formats.QUANTIZERS) == set(OPERAND_FORMATS)
    x = torch.randn(32, 128)
    for fmt in OPERAND_FORMATS:
        quantized = formats.quantize(x, fmt)  # dispatched through QUANTIZERS[fmt]
        assert quantized.fmt == fmt and quantized.codes.shape == x.shape
        values, _ = formats.quantize_scaled_values(x, fmt, dtype=torch.float32)
        assert torch.equal(values, quantized.scaled_values(torch.float32)), fmt
