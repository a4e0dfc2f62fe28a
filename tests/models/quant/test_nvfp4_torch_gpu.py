"""The torch NVFP4 backend on a CUDA GPU: the kernel-quantized operands, the layer compiled, and (on compute
capability 10.0 and later) the native GEMMs against the emulated layer.

Run on the GPU machine: ``pytest -m gpu tests/models/quant/test_nvfp4_torch_gpu.py``. The first group runs on
any CUDA GPU (Hopper included), with the GEMM replaced by one computed from the packed operands; the second,
``blackwell``, needs what ``format_registry.NVFP4_TORCH`` names and skips elsewhere.

Tolerances of the native GEMM. Operands are compared bit for bit (the quantizers are the emulated layer's).
The GEMM multiplies the same E2M1 codes and E4M3 scales: every product q_a s_a q_b s_b is exact, so only the
accumulation differs. We assume the tensor cores add each 16-long block's products and the blocks in fp32,
and allow 2^-12 of S = sum_k |a_k b_k| per output (fp32 output), plus 2^-8 of the reference where outputs are
rounded to bf16. fp32 summation in any order stays within R * 2^-24 * S, far inside; a wrong scale, layout or
orientation moves an element by O(S), and NVFP4's quantization by ~2^-3 S. Had the accumulator fewer bits (as
Hopper's FP8 one has), this bound would be the first thing to fail: it has not been run on Blackwell yet. On
operands whose sums are exact on any accumulator (small integers times powers of two) the native and the
reference results must be equal.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from models.quant import kernels, nvfp4_torch
from models.quant.format_registry import NVFP4_TORCH
from models.quant.gemm_spec import OperandSpec, nvfp4_linear_spec
from models.quant.linear import QuantLinear
from models.quant.nvfp4_layout import Nvfp4Codes, Nvfp4Operand
from models.quant.nvfp4_torch import TorchNvfp4Linear, nvfp4_gemm, quantize_operand, reference_codes

pytestmark = pytest.mark.gpu

ACCUMULATION = 2.0**-12
BF16_ROUNDING = 2.0**-8


@pytest.fixture(autouse=True)
def _switches():
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # the references are true fp32 / fp64 matmuls
    kernels.use_triton(True)
    yield
    kernels.use_triton(True)
    torch.backends.cuda.matmul.allow_tf32 = tf32


@pytest.fixture
def blackwell():
    capability = torch.cuda.get_device_capability()
    if not NVFP4_TORCH.allows(capability):
        pytest.skip(f"torch runs the NVFP4 GEMM on {NVFP4_TORCH.describe()}; this GPU is {capability}")
    assert nvfp4_torch.has_nvfp4_scaled_mm(), f"torch {torch.__version__} lacks the NVFP4 scaled_mm"


def _fresh(rows: int, cols: int, dtype=torch.bfloat16) -> torch.Tensor:
    scale = float(torch.empty(()).uniform_(-3, 3).exp())
    x = torch.randn(rows, cols, device="cuda") * scale * (torch.rand(rows, 1, device="cuda") + 0.05)
    x.view(-1)[torch.randint(0, rows * cols, (max(1, rows * cols // 300),), device="cuda")] *= 40.0
    return x.to(dtype)


def _stand_in_gemm(a, b, out_dtype):
    """The GEMM from the packed operands, in fp32: what the native one computes up to the sums' order."""
    return (a.scaled_values() @ b.scaled_values().t()).mul_(a.decode * b.decode).to(out_dtype)


def _run(module, x, grad_output):
    x = x.clone().requires_grad_(True)
    module.weight.grad = None
    y = module(x)
    y.backward(grad_output)
    return y.detach(), x.grad, module.weight.grad.clone()


def _pair(in_features, out_features, spec, dtype=torch.float32):
    linear = nn.Linear(in_features, out_features, bias=False, device="cuda", dtype=dtype)
    with torch.no_grad():
        linear.weight.copy_(_fresh(out_features, in_features, torch.float32) * 0.05)
    native = TorchNvfp4Linear.from_linear(linear, spec, name="layers.1.mixer.up_proj")
    emulated = QuantLinear.from_linear(linear, spec, name="layers.1.mixer.up_proj")
    for module in (native, emulated):  # the trainer's seeds: the same Philox draws in both layers
        module.set_seed(17, layer=2)
        module.set_step(5)
    return native, emulated


# ----------------------------------------------------------------------------------------------
# Any CUDA GPU: the kernels' operands, the wiring, the compiled layer


@pytest.mark.parametrize("four_over_six", [None, "mse"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernel_operands_are_the_torch_references(four_over_six, dtype):
    x = _fresh(272, 336, dtype)  # 336 columns and 272 rows: reductions of 16 mod 32 in both orientations
    for tile, rht, transpose in (((1, 16), False, False), ((16, 16), False, False), ((16, 16), False, True),
                                 ((1, 16), False, True), ((1, 16), True, True)):
        spec = OperandSpec("nvfp4", tile, rht=rht, four_over_six=four_over_six)
        assert nvfp4_torch.kernel_for(x, spec, transpose) is not None, "the kernels take it on CUDA"
        got = quantize_operand(x, spec, transpose=transpose, name="op").operand()
        want = reference_codes(x, spec, transpose=transpose, name="op").operand()
        what = f"{spec.describe()} transpose={transpose}"
        assert torch.equal(got.data, want.data), f"{what}: codes"
        assert torch.equal(got.scale, want.scale), f"{what}: scales"
        assert torch.equal(got.decode, want.decode), f"{what}: decode"


@pytest.mark.parametrize("spec_name", ["paper", "weight_1d", "four_over_six"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_layer_with_the_stand_in_gemm_is_the_emulated_layer(monkeypatch, spec_name, dtype):
    """Kernels on both sides, stochastic rounding with the same seeds: the layer's operands give the emulated
    layer's outputs up to the sums' order (so its Philox draws are the emulated layer's)."""
    spec = {"paper": nvfp4_linear_spec(), "weight_1d": nvfp4_linear_spec(weight_2d=False),
            "four_over_six": nvfp4_linear_spec(four_over_six=("x", "w", "dy"))}[spec_name]
    monkeypatch.setattr(nvfp4_torch, "nvfp4_gemm", _stand_in_gemm)
    monkeypatch.setattr(nvfp4_torch, "check_native_support", lambda *args, **kwargs: None)
    native, emulated = _pair(336, 208, spec, dtype)
    x, grad_output = _fresh(4 * 272, 336, dtype).reshape(4, 272, 336), _fresh(4 * 272, 208, dtype).reshape(4, 272, 208)
    for name, got, want in zip(("Y", "dX", "dW"), _run(native, x, grad_output), _run(emulated, x, grad_output)):
        tol = 2.0**-14 * want.float().abs().max() + (BF16_ROUNDING * want.float().abs() if dtype == torch.bfloat16 else 0)
        err = (got.float() - want.float()).abs()
        assert (err <= tol).all(), f"{name}: max excess {(err - tol).max().item():.3g}"


def _dequantized_scaled_gemm(a, b, scale_a, scale_b, decode_a, decode_b, out_dtype):
    ops = [Nvfp4Operand(data, scale, decode, 2 * data.shape[1]) for data, scale, decode in
           ((a, scale_a, decode_a), (b, scale_b, decode_b))]
    return (ops[0].scaled_values() @ ops[1].scaled_values().t()).mul_(decode_a * decode_b).to(out_dtype)


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_the_compiled_layer_is_eager_with_the_stand_in_gemm(monkeypatch, autocast):
    """Inductor compiles the layer (the kernels writing codes, packing, padding, the scale layout) around the
    GEMM op, whose inside is the stand-in: forward and gradients equal eager's, stochastic rounding included."""
    monkeypatch.setattr(nvfp4_torch, "_torch_scaled_gemm", _dequantized_scaled_gemm)
    monkeypatch.setattr(nvfp4_torch, "check_native_support", lambda *args, **kwargs: None)
    native, _ = _pair(336, 208, nvfp4_linear_spec())
    torch._dynamo.reset()
    try:
        compiled = torch.compile(native, fullgraph=True)
        x, grad_output = _fresh(2 * 272, 336, torch.float32).reshape(2, 272, 336), torch.randn(2, 272, 208, device="cuda")
        results = []
        for module in (native, compiled):
            xi = x.clone().requires_grad_(True)
            native.weight.grad = None
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                y = module(xi)
            y.backward(grad_output.to(y.dtype))
            results.append((y.detach(), xi.grad, native.weight.grad.clone()))
    finally:
        torch._dynamo.reset()
    for name, got, want in zip(("Y", "dX", "dW"), results[1], results[0]):
        assert torch.isfinite(want).all() and want.abs().sum() > 0, name
        assert torch.equal(got, want), f"{name}: compiled != eager, max diff {(got - want).abs().max().item():.3g}"


# ----------------------------------------------------------------------------------------------
# Compute capability 10.0 and later: the native GEMM


@pytest.mark.parametrize("m, n, reduction", [(256, 384, 640), (200, 96, 112), (1040, 48, 1040)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_the_native_gemm_is_the_reference(blackwell, m, n, reduction, out_dtype):
    a = reference_codes(_fresh(m, reduction), OperandSpec("nvfp4"), transpose=False, name="a").operand()
    b = quantize_operand(_fresh(reduction, n), OperandSpec("nvfp4", (1, 16), rht=True), transpose=True,
                         name="b").operand()
    got = nvfp4_gemm(a, b, out_dtype)
    a_values, b_values = a.scaled_values().double(), b.scaled_values().double()
    want = (a_values @ b_values.t()) * (a.decode.double() * b.decode.double())
    magnitude = (a_values.abs() @ b_values.abs().t()) * (a.decode.double() * b.decode.double())
    tol = ACCUMULATION * magnitude + (BF16_ROUNDING * want.abs() if out_dtype == torch.bfloat16 else 0)
    assert got.dtype == out_dtype and got.shape == (m, n)
    err = (got.double() - want).abs()
    assert (err <= tol).all(), f"max excess {(err - tol).max().item():.3g} (max |C| {want.abs().max().item():.3g})"


def test_the_native_gemm_is_exact_where_every_sum_is(blackwell):
    """Codes in {0, +-0.5, +-1, +-2}, scales powers of two between 1/4 and 4, tensor scales 1: every partial sum
    is a multiple of 2^-6 below 2^14, exact in fp32 whatever the order, so native == reference, bit for bit."""
    m, n, reduction = 128, 64, 256
    codes = {name: torch.tensor([0, 1, 2, 4, 9, 10, 12], dtype=torch.uint8, device="cuda")[
        torch.randint(0, 7, shape, device="cuda")] for name, shape in (("a", (m, reduction)), ("b", (n, reduction)))}
    exponents = {name: torch.randint(-2, 3, (rows, reduction // 16), device="cuda") for name, rows in (("a", m), ("b", n))}
    operands = {name: Nvfp4Codes.from_codes(codes[name],
                                            (2.0 ** exponents[name]).to(torch.float8_e4m3fn).view(torch.uint8),
                                            torch.ones((), device="cuda")).operand() for name in ("a", "b")}
    want = operands["a"].scaled_values() @ operands["b"].scaled_values().t()
    for out_dtype in (torch.float32, torch.bfloat16):
        got = nvfp4_gemm(operands["a"], operands["b"], out_dtype)
        assert torch.equal(got, want.to(out_dtype)), out_dtype


@pytest.mark.parametrize("spec_name", ["paper", "weight_1d", "four_over_six", "wgrad_bf16"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_native_layer_is_the_emulated_layer(blackwell, spec_name, dtype):
    spec = {"paper": nvfp4_linear_spec(), "weight_1d": nvfp4_linear_spec(weight_2d=False),
            "four_over_six": nvfp4_linear_spec(four_over_six=("x", "w", "dy")),
            "wgrad_bf16": nvfp4_linear_spec(quantize_wgrad=False)}[spec_name]
    native, emulated = _pair(336, 208, spec, dtype)  # K 336 and N 208: padded reductions in Fprop and Dgrad
    x, grad_output = _fresh(4 * 272, 336, dtype).reshape(4, 272, 336), _fresh(4 * 272, 208, dtype).reshape(4, 272, 208)
    got, want = _run(native, x, grad_output), _run(emulated, x, grad_output)
    magnitudes = (x.float().abs().reshape(-1, 336) @ native.weight.float().abs().t(),
                  grad_output.float().abs().reshape(-1, 208) @ native.weight.float().abs(),
                  grad_output.float().abs().reshape(-1, 208).t() @ x.float().abs().reshape(-1, 336))
    for name, a, b, magnitude in zip(("Y", "dX", "dW"), got, want, magnitudes):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        # 2x: quantization can grow the operands' magnitudes (the RHT spreads them within a tile, too)
        tol = 2 * ACCUMULATION * magnitude.reshape(a.shape) + (BF16_ROUNDING * b.float().abs() if a.dtype != torch.float32
                                                               else 0)
        err = (a.float() - b.float()).abs()
        assert (err <= tol).all(), f"{name}: max excess {(err - tol).max().item():.3g}"


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_the_compiled_native_layer_is_eager(blackwell, autocast):
    native, _ = _pair(336, 208, nvfp4_linear_spec())
    torch._dynamo.reset()
    try:
        compiled = torch.compile(native, fullgraph=True)
        x, grad_output = _fresh(2 * 272, 336, torch.float32).reshape(2, 272, 336), torch.randn(2, 272, 208, device="cuda")
        results = []
        for module in (native, compiled):
            xi = x.clone().requires_grad_(True)
            native.weight.grad = None
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                y = module(xi)
            y.backward(grad_output.to(y.dtype))
            results.append((y.detach(), xi.grad, native.weight.grad.clone()))
    finally:
        torch._dynamo.reset()
    for name, got, want in zip(("Y", "dX", "dW"), results[1], results[0]):
        assert torch.isfinite(want).all() and want.abs().sum() > 0, name
        assert torch.equal(got, want), f"{name}: compiled != eager"


def test_the_ops_fake_plans_the_real_output(blackwell):
    from torch._subclasses.fake_tensor import FakeTensorMode

    a = reference_codes(_fresh(200, 112), OperandSpec("nvfp4"), transpose=False, name="a").operand()
    b = reference_codes(_fresh(96, 112), OperandSpec("nvfp4"), transpose=False, name="b").operand()
    tensors = (a.data, b.data, a.scale, b.scale, a.decode, b.decode)
    real = nvfp4_torch.scaled_gemm(*tensors, torch.bfloat16)
    with FakeTensorMode() as mode:
        fake = nvfp4_torch.scaled_gemm(*(mode.from_tensor(t) for t in tensors), torch.bfloat16)
    assert (fake.shape, fake.stride(), fake.dtype) == (real.shape, real.stride(), real.dtype)
