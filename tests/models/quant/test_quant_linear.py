"""QuantLinear against a straightforward computation built from the independent oracles."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from models.quant import linear as quant_linear
from models.quant.bf16_rounding import round_to_bf16_by_bits
from models.quant.formats import elements
from models.quant.gemm_spec import (
    GemmSpec,
    LinearSpec,
    OperandSpec,
    fp8_block_linear_spec,
    fp8_tensor_linear_spec,
    mxfp4_linear_spec,
    mxfp8_linear_spec,
    nvfp4_linear_spec,
)
from models.quant.linear import QuantLinear

import quant_oracles as oracle

TOKENS, IN_FEATURES, OUT_FEATURES = 32, 64, 48


def _nvfp4(t: torch.Tensor, tile=(1, 16), uniform=None) -> dict:
    """Oracle NVFP4 of a 2D tensor (blocks along its last dim), as torch tensors."""
    result = oracle.nvfp4(oracle.to_numpy_f32(t.contiguous()), tile, uniform=uniform)
    return {
        "xhat": torch.from_numpy(result["xhat"].copy()),
        "scaled": torch.from_numpy(result["scaled"].copy()),
        "decode": torch.tensor(result["decode"], dtype=torch.float32),
    }


def _exactly_summable(*shape) -> torch.Tensor:
    """Multiples of 1/8 in [-64, 64): RHT butterflies on them are exact in fp32 (and in float64)."""
    return torch.randint(-512, 512, shape).float() / 8


def _rht_exact(t: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(oracle.rht_float64(t.numpy()).astype(np.float32))


def _layer(spec: LinearSpec, dtype=torch.float32, bias=False, name="layers.0.mixer.in_proj") -> QuantLinear:
    module = QuantLinear(IN_FEATURES, OUT_FEATURES, bias=bias, dtype=dtype, spec=spec, name=name)
    with torch.no_grad():
        module.weight.copy_(torch.randn(OUT_FEATURES, IN_FEATURES))
    return module


def _run(module: QuantLinear, x: torch.Tensor, grad_output: torch.Tensor):
    x = x.clone().requires_grad_(True)
    y = module(x)
    y.backward(grad_output)
    return y.detach(), x.grad, module.weight.grad


@pytest.mark.parametrize("weight_2d", [True, False])
def test_nvfp4_rne_fp32_matches_oracle_exactly(weight_2d):
    spec = nvfp4_linear_spec(weight_2d=weight_2d, wgrad_rht=False, stochastic_rounding=False)
    module = _layer(spec)
    x = oracle.fresh_input(TOKENS, IN_FEATURES, 1.0, torch.float32)
    dy = oracle.fresh_input(TOKENS, OUT_FEATURES, 0.01, torch.float32)
    y, dx, dw = _run(module, x, dy)

    w = module.weight.detach()
    w_fprop = _nvfp4(w, (16, 16) if weight_2d else (1, 16))["xhat"]
    assert torch.equal(y, _nvfp4(x)["xhat"] @ w_fprop.T)
    # Dgrad: the Fprop W itself when 2D; else W^T re-quantized along N from the high-precision W
    w_dgrad = w_fprop if weight_2d else _nvfp4(w.T)["xhat"].T.contiguous()
    assert torch.equal(dx, _nvfp4(dy)["xhat"] @ w_dgrad)
    assert torch.equal(dw, _nvfp4(dy.T)["xhat"] @ _nvfp4(x.T)["xhat"].T)
    assert dx.dtype == torch.float32 and dw.dtype == torch.float32


def test_nvfp4_rne_with_rht_matches_oracle_exactly():
    spec = nvfp4_linear_spec(stochastic_rounding=False)  # RHT on both Wgrad operands
    module = _layer(spec)
    x = _exactly_summable(TOKENS, IN_FEATURES)
    dy = _exactly_summable(TOKENS, OUT_FEATURES)
    _, _, dw = _run(module, x, dy)
    expected = _nvfp4(_rht_exact(dy.T))["xhat"] @ _nvfp4(_rht_exact(x.T))["xhat"].T
    assert torch.equal(dw, expected)
    # and the RHT made a difference (the test would notice a missing transform)
    assert not torch.equal(dw, _nvfp4(dy.T)["xhat"] @ _nvfp4(x.T)["xhat"].T)


def test_nvfp4_bf16_compute_matches_oracle_exactly():
    """bf16 GEMMs: scaled values (exact in bf16), fp32 accumulation, then both decode scales."""
    spec = nvfp4_linear_spec(wgrad_rht=False, stochastic_rounding=False)
    module = _layer(spec)  # FP32 master weight
    x = oracle.fresh_input(TOKENS, IN_FEATURES, 1.0, torch.bfloat16)
    dy = oracle.fresh_input(TOKENS, OUT_FEATURES, 0.01, torch.bfloat16)
    y, dx, dw = _run(module, x, dy)
    assert y.dtype == torch.bfloat16 and dx.dtype == torch.bfloat16 and dw.dtype == torch.float32

    def gemm(a: dict, b: dict, b_transposed: bool = True) -> torch.Tensor:
        a_values = a["scaled"].bfloat16().float()
        b_values = b["scaled"].bfloat16().float()
        product = a_values @ (b_values.t() if b_transposed else b_values)
        return (product * (a["decode"] * b["decode"])).bfloat16()

    w = module.weight.detach()
    w_q = _nvfp4(w, (16, 16))
    assert torch.equal(y, gemm(_nvfp4(x), w_q))
    assert torch.equal(dx, gemm(_nvfp4(dy), w_q, b_transposed=False))
    assert torch.equal(dw, gemm(_nvfp4(dy.T), _nvfp4(x.T)).float())


def test_stochastic_rounding_reproduces_documented_draws():
    """module.generator draws Dgrad's dY uniforms first, then Wgrad's dY^T; forward draws none."""
    spec = nvfp4_linear_spec(wgrad_rht=False)
    module = _layer(spec)
    x = oracle.fresh_input(TOKENS, IN_FEATURES, 1.0, torch.float32)
    dy = oracle.fresh_input(TOKENS, OUT_FEATURES, 0.01, torch.float32)
    module.generator = torch.Generator().manual_seed(11)
    _, dx, dw = _run(module, x, dy)

    draws = torch.Generator().manual_seed(11)
    uniform_dgrad = torch.rand(TOKENS, OUT_FEATURES, generator=draws).numpy()
    uniform_wgrad = torch.rand(OUT_FEATURES, TOKENS, generator=draws).numpy()
    w_q = _nvfp4(module.weight.detach(), (16, 16))["xhat"]
    assert torch.equal(dx, _nvfp4(dy, uniform=uniform_dgrad)["xhat"] @ w_q)
    assert torch.equal(dw, _nvfp4(dy.T, uniform=uniform_wgrad)["xhat"] @ _nvfp4(x.T)["xhat"].T)


def test_stochastic_rounding_draws_fresh_numbers_each_step():
    module = _layer(nvfp4_linear_spec())
    x = torch.randn(TOKENS, IN_FEATURES)
    dy = torch.randn(TOKENS, OUT_FEATURES)
    torch.manual_seed(5)
    _, dx_first, _ = _run(module, x, dy)
    module.weight.grad = None
    _, dx_second, _ = _run(module, x, dy)
    module.weight.grad = None
    assert not torch.equal(dx_first, dx_second), "two steps must not reuse the same random draws"
    torch.manual_seed(5)
    _, dx_again, _ = _run(module, x, dy)
    assert torch.equal(dx_first, dx_again), "the same seed reproduces the run"


def test_dgrad_uses_the_fprop_weight_without_requantizing(monkeypatch):
    calls = []
    original = quant_linear.formats.quantize_scaled_values

    def recording_quantize(tensor, fmt, **kwargs):
        calls.append(kwargs.get("name"))
        return original(tensor, fmt, **kwargs)

    monkeypatch.setattr(quant_linear.formats, "quantize_scaled_values", recording_quantize)
    x, dy = torch.randn(TOKENS, IN_FEATURES), torch.randn(TOKENS, OUT_FEATURES)
    _run(_layer(nvfp4_linear_spec(weight_2d=True)), x, dy)
    assert not any("Dgrad W^T" in name for name in calls), calls
    calls.clear()
    _run(_layer(nvfp4_linear_spec(weight_2d=False)), x, dy)
    assert sum("Dgrad W^T" in name for name in calls) == 1, calls


@pytest.mark.parametrize("builder", [nvfp4_linear_spec, mxfp4_linear_spec])
def test_emulated_gemms_build_no_element_codes(monkeypatch, builder):
    """The hot path needs only q * s_b: it rounds arithmetically, with no codes and no table lookups."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the emulated linear built element codes")

    monkeypatch.setattr(elements, "round_e2m1", forbidden)
    monkeypatch.setattr(quant_linear.formats.QuantizedTensor, "element_values", forbidden)
    module = QuantLinear(64, 64, bias=False, spec=builder(), name="blk")  # MX blocks are 32 long
    x, dy = torch.randn(TOKENS, 64), torch.randn(TOKENS, 64)
    y, dx, dw = _run(module, x, dy)
    assert torch.isfinite(y).all() and torch.isfinite(dx).all() and torch.isfinite(dw).all()


def test_2d_weight_quantization_is_transpose_invariant():
    """The W seen by Dgrad (W^T in 16x16 tiles) is the transpose of the W seen by Fprop."""
    from models.quant.formats import fake_quantize

    w = torch.randn(48, 64)
    assert torch.equal(fake_quantize(w, "nvfp4", tile=(16, 16)).T, fake_quantize(w.T, "nvfp4", tile=(16, 16)))
    assert not torch.equal(fake_quantize(w, "nvfp4").T, fake_quantize(w.T, "nvfp4"))  # 1x16 is not


@pytest.mark.parametrize("autocast", [False, True])
def test_high_precision_spec_is_exactly_nn_linear(autocast):
    reference = nn.Linear(IN_FEATURES, OUT_FEATURES, bias=True)
    module = QuantLinear.from_linear(reference, nvfp4_linear_spec().switched_to_high_precision("forward_backward"))
    x = torch.randn(2, 16, IN_FEATURES, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = module(x)
        y_reference = reference(x)
    assert torch.equal(y, y_reference)


def test_late_switch_forward_only():
    spec = nvfp4_linear_spec(wgrad_rht=False, stochastic_rounding=False).switched_to_high_precision("forward")
    assert spec.fprop is None and spec.dgrad is not None and spec.wgrad is not None
    module = _layer(spec)
    x, dy = torch.randn(TOKENS, IN_FEATURES), torch.randn(TOKENS, OUT_FEATURES)
    y, dx, _ = _run(module, x, dy)
    assert torch.equal(y, F.linear(x, module.weight.detach()))
    # Dgrad still sees the 2D-quantized W (quantized from the high-precision W in the backward)
    assert torch.equal(dx, _nvfp4(dy)["xhat"] @ _nvfp4(module.weight.detach(), (16, 16))["xhat"])


def test_spec_is_mutable_on_the_module():
    module = _layer(nvfp4_linear_spec())
    x = torch.randn(TOKENS, IN_FEATURES)
    quantized = module(x)
    module.spec = module.spec.switched_to_high_precision("forward_backward")
    assert not torch.equal(quantized, module(x))
    assert torch.equal(module(x), F.linear(x, module.weight))


@pytest.mark.parametrize(
    "builder", [nvfp4_linear_spec, mxfp4_linear_spec, mxfp8_linear_spec, fp8_block_linear_spec, fp8_tensor_linear_spec]
)
def test_every_format_trains_close_to_high_precision(builder):
    in_features, out_features = 128, 256  # fp8_block needs 128-divisible dims
    module = QuantLinear(in_features, out_features, bias=False, spec=builder(), name="blk")
    x = torch.randn(4, 32, in_features, requires_grad=True)
    y = module(x)
    y.square().sum().backward()
    reference = x.detach() @ module.weight.detach().T
    relative = (y.detach() - reference).norm() / reference.norm()
    assert 0 < relative < 0.25
    assert x.grad.shape == x.shape and module.weight.grad.shape == module.weight.shape
    assert torch.isfinite(x.grad).all() and torch.isfinite(module.weight.grad).all()


def test_from_linear_keeps_parameters_and_state_dict():
    linear = nn.Linear(IN_FEATURES, OUT_FEATURES, bias=False)
    module = QuantLinear.from_linear(linear, nvfp4_linear_spec(), name="layers.2.mixer.out_proj")
    assert module.weight is linear.weight and module.bias is None
    assert list(module.state_dict().keys()) == list(linear.state_dict().keys()) == ["weight"]
    assert isinstance(module, nn.Linear)
    with_bias = nn.Linear(IN_FEATURES, OUT_FEATURES)
    module = QuantLinear.from_linear(with_bias, nvfp4_linear_spec())
    assert module.bias is with_bias.bias
    assert list(module.state_dict().keys()) == ["weight", "bias"]
    x = torch.randn(TOKENS, IN_FEATURES)
    module(x).sum().backward()
    assert torch.equal(with_bias.bias.grad, torch.full((OUT_FEATURES,), float(TOKENS)))


def test_gradients_come_back_in_parameter_and_input_dtypes():
    module = _layer(nvfp4_linear_spec())
    x = torch.randn(TOKENS, IN_FEATURES, dtype=torch.bfloat16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = module(x)
    y.float().sum().backward()
    assert y.dtype == torch.bfloat16
    assert x.grad.dtype == torch.bfloat16 and module.weight.grad.dtype == torch.float32
    assert module.weight.dtype == torch.float32


def test_leading_dims_flattened_into_tokens():
    spec = nvfp4_linear_spec(wgrad_rht=False, stochastic_rounding=False)
    module = _layer(spec)
    x = torch.randn(2, TOKENS // 2, IN_FEATURES)
    y = module(x)
    assert y.shape == (2, TOKENS // 2, OUT_FEATURES)
    assert torch.equal(y.reshape(TOKENS, OUT_FEATURES), module(x.reshape(TOKENS, IN_FEATURES)))


# ------------------------------------------------------------------------------------------------
# Errors and non-finite values


def test_in_features_not_divisible_names_layer_and_dim():
    module = QuantLinear(40, 32, bias=False, spec=nvfp4_linear_spec(), name="layers.7.mixer.up_proj")
    with pytest.raises(ValueError, match=r"layers\.7\.mixer\.up_proj.*Fprop X.*in_features.* 40"):
        module(torch.randn(16, 40))


def test_token_count_not_divisible_names_layer_and_tokens():
    module = _layer(nvfp4_linear_spec(), name="layers.1.mixer.down_proj")
    with pytest.raises(ValueError, match=r"layers\.1\.mixer\.down_proj.*Wgrad dY\^T.*tokens.* 20"):
        module(torch.randn(20, IN_FEATURES))
    # with Wgrad in high precision, 20 tokens are fine (nothing else blocks along tokens)
    module.spec = nvfp4_linear_spec(quantize_wgrad=False)
    assert module(torch.randn(20, IN_FEATURES)).shape == (20, OUT_FEATURES)


def test_out_features_not_divisible_by_2d_tile():
    module = QuantLinear(64, 24, bias=False, spec=nvfp4_linear_spec(), name="blk.o_proj")
    with pytest.raises(ValueError, match=r"blk\.o_proj.*Fprop W.*out_features.* 24"):
        module(torch.randn(16, 64))


def test_nan_input_poisons_output_and_inf_gradient_poisons_grads():
    module = _layer(nvfp4_linear_spec())
    x = torch.randn(TOKENS, IN_FEATURES)
    x[3, 5] = math.nan
    assert module(x).isnan().all()
    dy = torch.randn(TOKENS, OUT_FEATURES)
    dy[0, 0] = math.inf
    _, dx, dw = _run(module, torch.randn(TOKENS, IN_FEATURES), dy)
    assert dx.isnan().all() and dw.isnan().all(), "an Inf gradient is never clipped into finite values"


def test_operand_spec_validation():
    with pytest.raises(ValueError, match="stochastic"):
        OperandSpec("fp8_block", rounding="stochastic")
    with pytest.raises(ValueError, match="RHT"):
        OperandSpec("nvfp4", (16, 16), rht=True)
    with pytest.raises(ValueError, match="does not support tile"):
        OperandSpec("mxfp8", (16, 16))
    assert OperandSpec("nvfp4").tile == (1, 16)


def test_unknown_backend_raises_with_layer_name():
    spec = nvfp4_linear_spec()
    spec.backend = "te"
    module = _layer(spec, name="layers.4.mixer.q_proj")
    with pytest.raises(NotImplementedError, match=r"layers\.4\.mixer\.q_proj.*te"):
        module(torch.randn(TOKENS, IN_FEATURES))


def test_spec_builders_follow_the_design_table():
    spec = nvfp4_linear_spec()
    assert spec.fprop == GemmSpec(OperandSpec("nvfp4", (1, 16)), OperandSpec("nvfp4", (16, 16)))
    assert spec.dgrad == GemmSpec(OperandSpec("nvfp4", (1, 16), "stochastic"), OperandSpec("nvfp4", (16, 16)))
    assert spec.wgrad == GemmSpec(
        OperandSpec("nvfp4", (1, 16), "stochastic", rht=True), OperandSpec("nvfp4", (1, 16), rht=True)
    )
    assert spec.reuses_forward_weight and not nvfp4_linear_spec(weight_2d=False).reuses_forward_weight
    ablation = nvfp4_linear_spec(wgrad_rht=False, stochastic_rounding=False, quantize_dgrad=False)
    assert ablation.dgrad is None and not ablation.wgrad.a.rht and ablation.wgrad.a.rounding == "nearest"
    fp8 = fp8_block_linear_spec(power_of_two_scales=False)
    assert fp8.fprop.b.tile == (128, 128) and fp8.wgrad.b.tile == (1, 128)
    assert not fp8.fprop.a.power_of_two_scales and fp8.reuses_forward_weight


def test_cpu_path_never_imports_the_kernels_module():
    code = (
        "import sys, torch\n"
        "from models.quant.gemm_spec import nvfp4_linear_spec\nfrom models.quant.linear import QuantLinear\n"
        "m = QuantLinear(32, 32, bias=False, spec=nvfp4_linear_spec())\n"
        "m(torch.randn(16, 32)).sum().backward()\n"
        "assert 'models.quant.kernels' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(__import__("pathlib").Path(__file__).parents[3]))


def test_round_to_bf16_by_bits_is_the_cast():
    """The traced GEMM output's rounding (integer ops on the bits) is torch's fp32 -> bf16 cast: on
    random values, exact ties both ways, values that carry into the exponent, subnormals, the
    overflow to Inf and the specials."""
    torch.manual_seed(0)
    random = torch.randn(4096) * torch.exp2(torch.randint(-140, 120, (4096,)).float())
    # exact ties between two bf16 neighbours (low 16 bits 0x8000), even and odd kept bits, in [1, 2)
    halfway = (torch.randint(0, 128, (512,), dtype=torch.int32) << 16 | 0x3F808000).view(torch.float32)
    specials = torch.tensor([0.0, -0.0, 1e-45, -1e-45, 1e-39, 3.3895e38, 3.4028e38, -3.4028e38,
                             float("inf"), float("-inf"), 1.0 - 2**-24, 255.99999])
    y = torch.cat([random, -random, halfway, -halfway, specials])
    rounded = round_to_bf16_by_bits(y)
    assert torch.equal(rounded.view(torch.int32), y.to(torch.bfloat16).float().view(torch.int32))
    nan = round_to_bf16_by_bits(torch.tensor([float("nan")]))
    assert torch.isnan(nan).all()


def test_compiled_bf16_gemm_output_feeds_its_consumers_rounded():
    """Under torch.compile a bf16 GEMM output is scaled and rounded by traced torch ops (which Inductor
    fuses into the consumer); the consumers must see the bf16-rounded value exactly as in eager mode.
    The function around the layer doubles X and the output in fp32 (exact), so a lost rounding of Y
    or of dX would show bit for bit; Inductor on the CPU generates and fuses the code that the GPU runs
    in Triton."""
    import torch._dynamo

    module = _layer(nvfp4_linear_spec(stochastic_rounding=False))
    torch.manual_seed(1)
    x = torch.randn(TOKENS, IN_FEATURES).to(torch.bfloat16)
    dy = torch.randn(TOKENS, OUT_FEATURES).to(torch.bfloat16).float()  # 2 dY is exact in bf16

    def around(inputs):
        return module(inputs * 2).float() * 2

    def run(fn):
        inputs = x.clone().requires_grad_(True)
        module.weight.grad = None
        y = fn(inputs)
        y.backward(dy)
        return y, inputs.grad, module.weight.grad.clone()

    torch._dynamo.reset()
    eager = run(around)
    assert eager[0].dtype == torch.float32 and eager[1].dtype == torch.bfloat16
    for backend in ("aot_eager", "inductor"):
        compiled = run(torch.compile(around, backend=backend, fullgraph=True))
        for what, got, want in zip(("Y", "dX", "dW"), compiled, eager):
            assert torch.equal(got, want), f"{backend}: {what} differs from eager"
    torch._dynamo.reset()


def test_torch_compile_traces_without_graph_breaks_and_keeps_numerics():
    """The trainer compiles the model: QuantLinear must trace whole and round as in eager mode."""
    import torch._dynamo

    module = _layer(nvfp4_linear_spec())
    x = torch.randn(TOKENS, IN_FEATURES, requires_grad=True)
    dy = torch.randn(TOKENS, OUT_FEATURES)

    def gradients(model):
        x.grad = module.weight.grad = None
        model(x).backward(dy)
        return torch.cat([x.grad.flatten(), module.weight.grad.flatten()])

    torch._dynamo.reset()
    assert torch._dynamo.explain(module)(x).graph_break_count == 0
    compiled = torch.compile(module, backend="aot_eager")
    module.generator = torch.Generator().manual_seed(3)
    eager = gradients(module)
    module.generator.manual_seed(3)
    assert torch.equal(gradients(compiled), eager)
    assert not torch.equal(gradients(compiled), eager), "SR draws advance from step to step under compile"
    torch._dynamo.reset()


def test_a_sharded_operand_takes_the_kernels_with_the_groups_amax(monkeypatch, tmp_path):
    """Under tensor parallelism an operand whose amax the group reduces goes to the quantize kernels (where
    they run) with scales from its own amax pass made the group's by the all-reduce (kernels.nvfp4.
    group_scales, checked bit for bit under Triton's interpreter), not to the torch reference; a family that
    takes no given scales for it falls back to the reference. The kernel family is a recording stand-in here:
    on the CPU the layer never picks the Triton kernels."""
    import torch.distributed as dist

    from models.quant.quantized_linear import AmaxReduction

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        x = oracle.fresh_input(32, 64, 3.0, torch.float32).to(torch.bfloat16)
        spec = OperandSpec("nvfp4", (1, 16))
        reference = quant_linear._quantize_operand(x, spec, transpose=False, compute_dtype=torch.bfloat16, rng=None,
                                                   name="Fprop W")
        calls = []

        class Family:
            offers_scales = True

            @staticmethod
            def group_scales(tensor, operand_spec, transpose, reduce_amax):
                local = tensor.float().abs().amax().reshape(1)
                reduced = reduce_amax(local)  # the real all-reduce over the (one-rank) group
                calls.append(("group_scales", operand_spec, transpose, float(reduced)))
                return torch.cat([reduced.new_zeros(2), reduced, reduced]) if Family.offers_scales else None

            @staticmethod
            def quantize_operand(tensor, operand_spec, *, transpose, seed, generator, out_dtype, scales, name):
                calls.append(("kernel", name, None if scales is None else float(scales[2])))
                return reference.values.to(out_dtype), reference.decode

        monkeypatch.setattr(quant_linear, "kernel_for", lambda tensor, operand_spec, transpose: Family)
        reduction = AmaxReduction(dist.group.WORLD, frozenset({"Fprop W"}))
        amax = float(x.float().abs().amax())
        got = quant_linear._quantize_operand(x, spec, transpose=False, compute_dtype=torch.bfloat16, rng=None,
                                             name="Fprop W", amax=reduction)
        assert calls == [("group_scales", spec, False, amax), ("kernel", "Fprop W", amax)]
        assert torch.equal(got.values, reference.values)

        calls.clear()  # an operand the reduction does not name: the kernels' own amax pass, no group scales
        quant_linear._quantize_operand(x, spec, transpose=False, compute_dtype=torch.bfloat16, rng=None,
                                       name="Fprop X", amax=reduction)
        assert calls == [("kernel", "Fprop X", None)]

        calls.clear()  # no given scales for this operand: the torch reference with the group's amax
        Family.offers_scales = False
        fallback = quant_linear._quantize_operand(x, spec, transpose=False, compute_dtype=torch.bfloat16, rng=None,
                                                  name="Fprop W", amax=reduction)
        assert [call[0] for call in calls] == ["group_scales"]
        assert torch.equal(fallback.values, reference.values) and torch.equal(fallback.decode, reference.decode)
    finally:
        dist.destroy_process_group()
