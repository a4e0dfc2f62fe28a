"""The torch NVFP4 backend on the CPU: the scale layout and the FP4 packing against torch's own helpers
(torch.testing._internal.common_quantized) and ml_dtypes, every operand against formats.quantize, the three
GEMMs computed from the packed operands against the emulated layer, torch's scaled-mm checks on our layouts,
the layer's contract, and the backend resolution.

torch runs the NVFP4 GEMM only on CUDA (compute capability 10.0+): tests/models/quant/test_nvfp4_torch_gpu.py
runs it there. Here the GEMM is replaced by a reference written from the packed operands.
"""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.testing._internal.common_quantized import (_bfloat16_to_float4_e2m1fn_x2, _floatx_unpacked_to_f32,
                                                      from_blocked, pack_uint4, to_blocked)

from models.quant import formats, nvfp4_torch
from models.quant.gemm_spec import OperandSpec, fp8_block_linear_spec, nvfp4_linear_spec
from models.quant.linear import QuantLinear
from models.quant.nvfp4_layout import (Nvfp4Codes, Nvfp4Operand, pack_codes, swizzle_scales, unpack_codes,
                                       unswizzle_scales)
from models.quant.nvfp4_torch import TorchNvfp4Linear, quantize_operand, reference_codes
from models.quant.rht import rht


def _fresh(rows: int, cols: int, dtype=torch.float32) -> torch.Tensor:
    """Random normal, a scale drawn per call, rows of different magnitude, outliers, -0.0 and a zero block."""
    scale = float(torch.empty(()).uniform_(-4, 4).exp())
    x = torch.randn(rows, cols) * scale * (torch.rand(rows, 1) + 0.05)
    x.view(-1)[torch.randint(0, rows * cols, (max(1, rows * cols // 200),))] *= 40.0
    x[0, :16] = 0.0
    x[1, :8] = -0.0
    return x.to(dtype)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


# ----------------------------------------------------------------------------------------------
# (1) The scale layout: torch's to_blocked is the oracle


@pytest.mark.parametrize("rows", [1, 31, 128, 129, 300, 512])
@pytest.mark.parametrize("cols", [1, 2, 3, 4, 5, 8, 13])
def test_swizzle_is_torchs_to_blocked(rows, cols):
    scales = torch.randint(0, 127, (rows, cols), dtype=torch.uint8)  # E4M3 bytes of positive finite scales
    swizzled = swizzle_scales(scales)
    expected = _bytes(to_blocked(scales.view(torch.float8_e4m3fn)))
    assert swizzled.shape == expected.shape == (-(-rows // 128) * 128 * -(-cols // 4) * 4,)
    assert torch.equal(swizzled, expected)
    assert torch.equal(unswizzle_scales(swizzled, rows, cols), scales)
    if rows > 1:  # row 1 lands 16 bytes in, not 4 (or 1): the layouts differ, so the comparison can fail
        plain = torch.nn.functional.pad(scales, (0, -cols % 4, 0, -rows % 128)).reshape(-1)
        assert not torch.equal(swizzled, plain)


def test_swizzle_of_a_transposed_view_and_torchs_slow_inverse():
    """A transposed operand's scales are a strided view; torch's loop-by-loop from_blocked (the cuBLAS
    formula written out) reads the scales back from our layout."""
    natural = torch.randint(1, 127, (9, 200), dtype=torch.uint8)  # [T/16, K] as the columns kernel writes them
    operand_scales = natural.t()  # [K = 200 rows, T/16 = 9 blocks]
    swizzled = swizzle_scales(operand_scales)
    data = torch.zeros(200, 9 * 16)
    back = from_blocked(data, swizzled.view(torch.float8_e4m3fn), 16)
    assert torch.equal(_bytes(back), operand_scales.contiguous())


# ----------------------------------------------------------------------------------------------
# (2) FP4 packing: torch's float4_e2m1fn_x2 converters and ml_dtypes are the oracles


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_codes_are_the_bytes_of_torchs_float4_e2m1fn_x2(dtype):
    x = _fresh(64, 96, dtype)
    quantized = formats.quantize(x, "nvfp4", tile=(1, 16))
    assert (quantized.codes == 8).any(), "-0.0 gives code 8: the sign nibble is exercised"
    operand = Nvfp4Codes.from_codes(quantized.codes, _bytes(quantized.block_scales),
                                    quantized.tensor_scale).operand()
    q = quantized.element_values()
    # torch's own encoder of values to float4_e2m1fn_x2 (to E2M1 codes, then pack_uint4) gives our bytes
    assert torch.equal(operand.data, _bfloat16_to_float4_e2m1fn_x2(q.bfloat16()).view(torch.uint8))
    assert torch.equal(operand.data, pack_uint4(quantized.codes))
    assert torch.equal(operand.data, quantized.packed_codes())
    # torch's decoder reads our nibbles back as the quantizer's values (signs included)
    decoded = _floatx_unpacked_to_f32(unpack_codes(operand.data), 2, 1)
    assert torch.equal(decoded.view(torch.int32), q.view(torch.int32))
    # ml_dtypes' float4_e2m1fn (one code a byte) agrees on every code
    via_ml_dtypes = unpack_codes(operand.data).numpy().view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    np.testing.assert_array_equal(via_ml_dtypes.view(np.int32), q.numpy().view(np.int32))
    assert operand.data.view(torch.float4_e2m1fn_x2).shape == (64, 48)
    assert torch.equal(operand.codes(), quantized.codes)


@pytest.mark.parametrize("tile", [(1, 16), (16, 16)])
def test_a_row_slice_of_the_codes_is_the_operand_of_those_rows(tile):
    """A row-parallel layer's Fprop a sequence at a time takes row_slice of X's codes: the operand of rows
    [16, 48) is those rows of the whole operand (codes, scales, decode scale); a slice across a tile refuses."""
    quantized = formats.quantize(_fresh(64, 96, torch.bfloat16), "nvfp4", tile=tile)
    codes = Nvfp4Codes.from_codes(quantized.codes, _bytes(quantized.block_scales), quantized.tensor_scale, tile[0])
    whole, part = codes.operand(), codes.row_slice(16, 32).operand()
    assert torch.equal(part.codes(), whole.codes()[16:48])
    assert torch.equal(part.dequantize(), whole.dequantize()[16:48])
    if tile[0] > 1:
        with pytest.raises(ValueError, match="cuts a 16-row tile"):
            codes.row_slice(8, 16)


def test_pack_codes_takes_a_transposed_view_and_writes_row_major():
    codes = torch.randint(0, 16, (64, 48), dtype=torch.uint8)
    packed = pack_codes(codes.t())
    assert packed.shape == (48, 32) and packed.stride() == (32, 1)
    assert torch.equal(unpack_codes(packed), codes.t())
    assert torch.equal(packed & 15, codes.t()[:, 0::2]) and torch.equal(packed >> 4, codes.t()[:, 1::2])
    with pytest.raises(ValueError, match="even"):
        pack_codes(codes[:, :3])


@pytest.mark.parametrize("reduction", [32, 48, 80])
def test_operands_pad_the_reduction_to_32_with_zero_blocks(reduction):
    x = _fresh(40, reduction)
    quantized = formats.quantize(x, "nvfp4")
    operand = reference_codes(x, OperandSpec("nvfp4"), transpose=False, name="x").operand()
    padded = -(-reduction // 32) * 32
    assert operand.data.shape == (40, padded // 2) and operand.reduction == reduction
    assert not operand.data[:, reduction // 2:].any(), "the padding holds zero codes"
    scales = unswizzle_scales(operand.scale, 40, padded // 16)
    assert not scales[:, reduction // 16:].any(), "under zero scales"
    assert torch.equal(_bytes(operand.block_scales()), _bytes(quantized.block_scales))
    assert torch.equal(operand.dequantize(), quantized.dequantize(torch.float32))


# ----------------------------------------------------------------------------------------------
# Every operand is formats.quantize's, bit for bit


def _expected(matrix, spec, generator=None):
    return formats.quantize(matrix, "nvfp4", tile=spec.tile, rounding=spec.rounding, generator=generator,
                            four_over_six=spec.four_over_six)


def _assert_operand(operand: Nvfp4Operand, expected, what: str):
    assert torch.equal(operand.codes(), expected.codes), f"{what}: codes"
    scales = expected.block_scales
    if expected.tile == (16, 16):
        scales = scales.repeat_interleave(16, dim=0)
    assert torch.equal(_bytes(operand.block_scales()), _bytes(scales)), f"{what}: scales"
    assert torch.equal(operand.decode, expected.tensor_scale), f"{what}: decode"


@pytest.mark.parametrize("four_over_six", [None, "mse"])
def test_every_orientation_is_the_reference_quantizer_of_that_operand(four_over_six):
    x = _fresh(64, 96)
    w = _fresh(80, 96)
    row = OperandSpec("nvfp4", (1, 16), four_over_six=four_over_six)
    tile = OperandSpec("nvfp4", (16, 16), four_over_six=four_over_six)
    columns_rht = OperandSpec("nvfp4", (1, 16), rht=True, four_over_six=four_over_six)
    _assert_operand(quantize_operand(x, row, transpose=False, name="Fprop X").operand(), _expected(x, row), "X")
    w_codes = quantize_operand(w, tile, transpose=False, name="Fprop W")
    _assert_operand(w_codes.operand(), _expected(w, tile), "W 16x16")
    # W^T for Dgrad: Fprop's tiles transposed (with Four Over Six chosen on W itself, as TE and the kernels do)
    w_t = _expected(w, tile)
    _assert_operand(w_codes.t().operand(), type(w_t)(**{**w_t.__dict__, "codes": w_t.codes.t(),
                                                        "block_scales": w_t.block_scales.t()}), "W^T reused")
    _assert_operand(quantize_operand(w, row, transpose=True, name="Dgrad W^T").operand(), _expected(w.t(), row),
                    "W^T 1x16 along N")
    _assert_operand(quantize_operand(x, columns_rht, transpose=True, name="Wgrad X^T").operand(),
                    _expected(rht(x.t()), columns_rht), "X^T with the RHT")


def test_stochastic_operands_draw_the_emulated_layers_seeds():
    """With the trainer's seed tensor each operand draws from Generator(seed + crc32(name)), as QuantLinear's
    torch path does; another operand name draws otherwise."""
    dy = _fresh(64, 80)
    seed = torch.tensor([123456789])
    sr = OperandSpec("nvfp4", (1, 16), "stochastic")
    sr_rht = OperandSpec("nvfp4", (1, 16), "stochastic", rht=True)
    for spec, transpose, name in ((sr, False, "Dgrad dY"), (sr_rht, True, "Wgrad dY^T")):
        operand = quantize_operand(dy, spec, transpose=transpose, rng=seed, name=name).operand()
        generator = torch.Generator().manual_seed(123456789 + zlib.crc32(name.encode()))
        matrix = rht(dy.t()) if transpose else dy
        _assert_operand(operand, _expected(matrix, spec, generator), name)
        other = quantize_operand(dy, spec, transpose=transpose, rng=seed, name="Fprop X").operand()
        assert not torch.equal(other.codes(), operand.codes()), "the operand's name picks its draws"


# ----------------------------------------------------------------------------------------------
# (3) The GEMMs from the packed operands against the emulated layer


def _reference_from_packed(a: Nvfp4Operand, b: Nvfp4Operand, out_dtype, swap_nibbles=False) -> torch.Tensor:
    """What cuBLASLt computes, from the bytes it is handed, with torch's decoders: nibbles to E2M1 values
    (_floatx_unpacked_to_f32), the swizzled scales read back by from_blocked, block products summed in fp32,
    times S_dec_a * S_dec_b, one rounding. ``swap_nibbles``: A's bytes read high nibble first (a control;
    swapping both operands' would permute the reduction alike in both and change nothing)."""
    def values(operand, swap=False):
        low, high = operand.data & 15, operand.data >> 4
        if swap:
            low, high = high, low
        codes = torch.stack((low, high), dim=-1).reshape(operand.rows, -1)
        elements = _floatx_unpacked_to_f32(codes, 2, 1)
        scales = from_blocked(elements, operand.scale.view(torch.float8_e4m3fn), 16).float()
        return elements * scales.repeat_interleave(16, dim=1)

    out = values(a, swap_nibbles) @ values(b).t()
    return (out * (a.decode * b.decode)).to(out_dtype)


def _run(module, x, grad_output):
    x = x.clone().requires_grad_(True)
    module.weight.grad = None
    y = module(x)
    y.backward(grad_output)
    return y.detach(), x.grad, module.weight.grad.clone()


SPECS = {
    "paper": lambda: nvfp4_linear_spec(),
    "weight_1d": lambda: nvfp4_linear_spec(weight_2d=False),
    "four_over_six": lambda: nvfp4_linear_spec(four_over_six=("x", "w", "dy")),
    "no_rht_no_sr": lambda: nvfp4_linear_spec(wgrad_rht=False, stochastic_rounding=False),
    "wgrad_bf16": lambda: nvfp4_linear_spec(quantize_wgrad=False),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("spec_name", list(SPECS))
def test_the_gemms_of_the_packed_operands_are_the_emulated_layers(monkeypatch, dtype, spec_name):
    """Every reduction here is 16 mod 32 (K 112, N 80, 48 tokens), so each GEMM's operands are padded. The
    GEMM, computed from the packed bytes, gives the emulated layer's Y, dX and dW up to the order of fp32
    additions (fp32 compute: the emulation multiplies dequantized operands, so one more fp32 rounding per
    product); with the nibbles read the other way round it does not."""
    calls = []

    def recording_gemm(a, b, out_dtype):
        calls.append((a, b, out_dtype))
        return _reference_from_packed(a, b, out_dtype)

    monkeypatch.setattr(nvfp4_torch, "nvfp4_gemm", recording_gemm)
    monkeypatch.setattr(nvfp4_torch, "check_native_support", lambda *args, **kwargs: None)
    linear = nn.Linear(112, 80, bias=False, dtype=dtype)
    with torch.no_grad():
        linear.weight.copy_(_fresh(80, 112) * 0.1)
    native = TorchNvfp4Linear.from_linear(linear, SPECS[spec_name](), name="layers.1.mixer.up_proj")
    emulated = QuantLinear.from_linear(linear, SPECS[spec_name](), name="layers.1.mixer.up_proj")
    for module in (native, emulated):  # the trainer's seeds: the same draws in both layers
        module.set_seed(7, layer=3)
        module.set_step(11)
    x = _fresh(48, 112, dtype).reshape(2, 24, 112)
    grad_output = _fresh(48, 80, dtype).reshape(2, 24, 80)
    got = _run(native, x, grad_output)
    want = _run(emulated, x, grad_output)
    quantized = [gemm for gemm in ("fprop", "dgrad", "wgrad") if getattr(native.spec, gemm) is not None]
    assert len(calls) == len(quantized) and all(out_dtype == dtype for _, _, out_dtype in calls)
    operands = dict(zip(quantized, calls))
    for gemm, name, a, b in zip(("fprop", "dgrad", "wgrad"), ("Y", "dX", "dW"), got, want):
        assert a.dtype == b.dtype and a.shape == b.shape and b.abs().sum() > 0, name
        if gemm not in operands:
            assert torch.equal(a, b), f"{name}: the high-precision GEMM is the emulated layer's"
            continue
        op_a, op_b, _ = operands[gemm]
        # Two fp32 evaluations of sum_k a_k b_k differ by at most (R + 2) units of 2^-24 of S = sum_k |a_k b_k|
        # (the sums' order; in fp32 compute also the emulation's rounded dequantized operands).
        magnitude = op_a.dequantize().abs() @ op_b.dequantize().abs().t()
        tol = (op_a.reduction + 2) * 2.0**-24 * magnitude.reshape(a.shape)
        if dtype == torch.bfloat16:
            tol = tol + 2.0**-8 * b.float().abs()  # the one bf16 rounding of slightly different fp32 sums
        err = (a.float() - b.float()).abs()
        assert (err <= tol).all(), f"{name}: max excess {(err - tol).max().item():.3g}"
    a, b, out_dtype = calls[0]
    swapped = _reference_from_packed(a, b, out_dtype, swap_nibbles=True)
    assert (swapped.float() - got[0].reshape(swapped.shape).float()).abs().max() > 1e-2 * got[0].float().abs().max()


def test_the_transposed_operands_reach_their_gemms(monkeypatch):
    """Dgrad multiplies dY by W^T [K, N] and Wgrad dY^T [N, T] by X^T [K, T]: each operand's codes are those of
    that orientation (the paper's recipe: Fprop's W tiles transposed, X^T after the RHT)."""
    calls = []
    monkeypatch.setattr(nvfp4_torch, "nvfp4_gemm", lambda a, b, out_dtype: calls.append((a, b)) or
                        torch.zeros(a.rows, b.rows, dtype=out_dtype))
    monkeypatch.setattr(nvfp4_torch, "check_native_support", lambda *args, **kwargs: None)
    spec = nvfp4_linear_spec(stochastic_rounding=False)
    native = TorchNvfp4Linear.from_linear(nn.Linear(96, 64, bias=False), spec, name="l")
    x, dy = _fresh(32, 96), _fresh(32, 64)
    _run(native, x, dy)
    (x_op, w_op), (dy_op, w_t_op), (dy_t_op, x_t_op) = calls
    w = native.weight.detach()
    for operand, matrix, operand_spec, what in (
            (x_op, x, spec.fprop.a, "X"), (w_op, w, spec.fprop.b, "W"), (dy_op, dy, spec.dgrad.a, "dY"),
            (dy_t_op, rht(dy.t()), spec.wgrad.a, "dY^T"), (x_t_op, rht(x.t()), spec.wgrad.b, "X^T")):
        _assert_operand(operand, _expected(matrix, operand_spec), what)
    assert torch.equal(w_t_op.codes(), w_op.codes().t()) and w_t_op.rows == 96


# ----------------------------------------------------------------------------------------------
# torch's scaled-mm checks accept our layouts (its meta function, on fake CUDA tensors)


def _fake_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda")


@pytest.mark.parametrize("m, n, reduction", [(256, 384, 640), (100, 96, 48), (3, 16, 16), (129, 32, 96)])
def test_scaled_mm_accepts_our_layouts(m, n, reduction):
    from torch._subclasses.fake_tensor import FakeTensorMode

    if not nvfp4_torch.has_nvfp4_scaled_mm():
        pytest.skip(f"torch {torch.__version__} has no NVFP4 scaled_mm")
    a = reference_codes(_fresh(m, reduction), OperandSpec("nvfp4"), transpose=False, name="a").operand()
    b = reference_codes(_fresh(reduction, n), OperandSpec("nvfp4"), transpose=True, name="b").operand()
    tensors = (a.data, b.data, a.scale, b.scale, a.decode, b.decode)
    for out_dtype in (torch.bfloat16, torch.float32):
        with FakeTensorMode():
            out = nvfp4_torch.scaled_gemm(*(_fake_like(t) for t in tensors), out_dtype)
            assert tuple(out.shape) == (m, n) and out.dtype == out_dtype
    with FakeTensorMode():  # the checks bite: unpadded rows, or scales not in the padded tile layout
        if reduction % 32:
            unpadded = torch.empty(m, reduction // 2, dtype=torch.uint8, device="cuda")
            with pytest.raises(RuntimeError, match="divisible by 16"):
                nvfp4_torch.scaled_gemm(unpadded, unpadded, _fake_like(a.scale), _fake_like(a.scale),
                                        _fake_like(a.decode), _fake_like(b.decode), torch.bfloat16)
        short = torch.empty(a.scale.numel() - 4, dtype=torch.uint8, device="cuda")
        with pytest.raises(RuntimeError, match="scale"):
            nvfp4_torch.scaled_gemm(*(_fake_like(t) for t in tensors[:2]), short, _fake_like(b.scale),
                                    *(_fake_like(t) for t in tensors[4:]), torch.bfloat16)


# ----------------------------------------------------------------------------------------------
# The layer's contract


def test_the_layer_refuses_the_cpu_naming_the_requirement():
    native = TorchNvfp4Linear.from_linear(nn.Linear(64, 64, bias=False), nvfp4_linear_spec(),
                                          name="layers.3.mixer.in_proj")
    with pytest.raises(RuntimeError, match=r"layers\.3\.mixer\.in_proj.*compute capability 10\.0 or later"):
        native(torch.randn(32, 64))


def test_specs_without_a_native_gemm_are_refused_naming_the_layer():
    linear = nn.Linear(128, 128, bias=False)
    with pytest.raises(ValueError, match=r"layers\.0\.mixer\.in_proj.*Fprop X.*fp8_block"):
        TorchNvfp4Linear.from_linear(linear, fp8_block_linear_spec(), name="layers.0.mixer.in_proj")
    with pytest.raises(ValueError, match=r"nvfp4_ue5m3"):
        TorchNvfp4Linear.from_linear(linear, nvfp4_linear_spec(fmt="nvfp4_ue5m3"), name="l")
    module = TorchNvfp4Linear.from_linear(linear, nvfp4_linear_spec(four_over_six=("w",)), name="l")
    with pytest.raises(ValueError, match="fp8_block"):
        module.spec = fp8_block_linear_spec()


def test_output_columns_must_be_multiples_of_16(monkeypatch):
    monkeypatch.setattr(nvfp4_torch, "check_native_support", lambda *args, **kwargs: None)
    spec = nvfp4_linear_spec(weight_2d=False, quantize_dgrad=False, quantize_wgrad=False)
    native = TorchNvfp4Linear.from_linear(nn.Linear(64, 40, bias=False), spec, name="layers.2.mixer.o_proj")
    with pytest.raises(ValueError, match=r"layers\.2\.mixer\.o_proj.*Fprop.*out_features 40"):
        native(torch.randn(32, 64))


def test_from_linear_keeps_the_parameters_and_state_dict():
    linear = nn.Linear(64, 32, bias=True).eval()
    module = TorchNvfp4Linear.from_linear(linear, nvfp4_linear_spec(), name="layers.1.mixer.up_proj")
    assert module.weight is linear.weight and module.bias is linear.bias and not module.training
    assert list(module.state_dict()) == list(linear.state_dict())
    assert "native NVFP4" in repr(module) and "layers.1.mixer.up_proj" in repr(module)
    built = TorchNvfp4Linear(64, 32, bias=False, name="x")
    assert built.spec == nvfp4_linear_spec() and list(built.state_dict()) == ["weight"]


def test_late_switch_runs_the_named_gemms_in_high_precision(monkeypatch):
    monkeypatch.setattr(nvfp4_torch, "nvfp4_gemm", _reference_from_packed)
    monkeypatch.setattr(nvfp4_torch, "check_native_support", lambda *args, **kwargs: None)
    linear = nn.Linear(64, 48, bias=False)
    native = TorchNvfp4Linear.from_linear(linear, nvfp4_linear_spec(stochastic_rounding=False), name="l")
    x, grad_output = torch.randn(32, 64), torch.randn(32, 48)
    quantized, plain = _run(native, x, grad_output), _run(linear, x, grad_output)
    assert not torch.equal(quantized[0], plain[0])
    native.set_high_precision(("fprop",))
    switched = _run(native, x, grad_output)
    assert torch.equal(switched[0], plain[0]), "Fprop in high precision is F.linear"
    assert torch.equal(switched[1], quantized[1]) and torch.equal(switched[2], quantized[2])
    native.set_high_precision(("dgrad", "wgrad"))
    for got, want in zip(_run(native, x, grad_output), plain):
        assert torch.equal(got, want)


def _dequantized_scaled_gemm(a, b, scale_a, scale_b, decode_a, decode_b, out_dtype):
    """A stand-in for torch's GEMM inside the custom op, on the CPU: the packed operands dequantized."""
    ops = [Nvfp4Operand(data, scale, decode, 2 * data.shape[1]) for data, scale, decode in
           ((a, scale_a, decode_a), (b, scale_b, decode_b))]
    return (ops[0].dequantize() @ ops[1].dequantize().t()).to(out_dtype)


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_the_layer_compiles_fullgraph_and_matches_eager(monkeypatch, autocast):
    """The layer traces whole (fullgraph: no graph break) with the GEMM as the custom op; forward and the
    gradients equal eager's. The torch reference quantizes (round to nearest: its stochastic rounding reads
    the seed on the host, as the emulated layer's does); the op's inside is a CPU stand-in."""
    monkeypatch.setattr(nvfp4_torch, "_torch_scaled_gemm", _dequantized_scaled_gemm)
    monkeypatch.setattr(nvfp4_torch, "check_native_support", lambda *args, **kwargs: None)
    native = TorchNvfp4Linear.from_linear(nn.Linear(96, 64, bias=True), nvfp4_linear_spec(stochastic_rounding=False),
                                          name="b")
    torch._dynamo.reset()
    try:
        compiled = torch.compile(native, backend="aot_eager", fullgraph=True)
        x, grad_output = _fresh(64, 96).reshape(2, 32, 96), torch.randn(2, 32, 64)
        results = []
        for module in (native, compiled):
            native.zero_grad(set_to_none=True)
            xi = x.clone().requires_grad_(True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                y = module(xi)
            y.backward(grad_output.to(y.dtype))
            results.append((y.detach(), xi.grad, native.weight.grad.clone(), native.bias.grad.clone()))
    finally:
        torch._dynamo.reset()
    for name, got, want in zip(("Y", "dX", "dW", "db"), results[1], results[0]):
        assert torch.isfinite(want).all() and want.abs().sum() > 0, name
        assert torch.equal(got, want), f"{name}: compiled != eager"


# ----------------------------------------------------------------------------------------------
# (4) The recipe: where backend=torch and auto build this layer


def _precision(fmt="nvfp4", backend="torch", **overrides):
    import dataclasses

    from models.quant.config import PrecisionConfig

    return dataclasses.replace(PrecisionConfig(name=fmt, format=fmt, backend=backend), **overrides)


@pytest.fixture
def gpu_of(monkeypatch):
    """Pretend the CUDA device has the given compute capability (and no Transformer Engine)."""
    from models.quant import te_backend

    monkeypatch.setattr(te_backend, "has_te", lambda: False)

    def set_capability(capability):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        return torch.device("cuda", 0)

    return set_capability


def test_backend_torch_with_nvfp4_is_refused_off_blackwell(gpu_of):
    from models.quant.recipe import resolve_backend

    with pytest.raises(RuntimeError, match=r"nvfp4 on compute capability 10\.0 or later.*this device is a CPU"):
        resolve_backend(_precision(), torch.device("cpu"))
    with pytest.raises(RuntimeError, match=r"compute capability 10\.0 or later.*this device is compute capability 9\.0"):
        resolve_backend(_precision(), gpu_of((9, 0)), tensor_parallel=True)
    with pytest.raises(RuntimeError, match=r"fp8_block on compute capability 9\.x.*this device is compute capability 10\.0"):
        resolve_backend(_precision("fp8_block"), gpu_of((10, 0)))
    with pytest.raises(ValueError, match=r"runs the formats .*nvfp4.* natively, not nvfp4_ue5m3"):
        resolve_backend(_precision("nvfp4_ue5m3"), gpu_of((10, 0)))


@pytest.mark.parametrize("capability", [(10, 0), (10, 3), (12, 0)])
def test_blackwell_runs_nvfp4_natively_under_tensor_parallelism(gpu_of, capability):
    from models.quant.recipe import resolve_backend

    device = gpu_of(capability)
    for fmt in ("nvfp4", "nvfp4_4over6"):
        assert resolve_backend(_precision(fmt), device, tensor_parallel=True) == "torch"
        assert resolve_backend(_precision(fmt, backend="auto"), device, tensor_parallel=True) == "torch"
        assert resolve_backend(_precision(fmt, backend="auto"), device) == "torch"  # no TE here
    assert resolve_backend(_precision("nvfp4_ue5m3", backend="auto"), device, tensor_parallel=True) == "emulated"
    assert resolve_backend(_precision(backend="auto"), gpu_of((9, 0)), tensor_parallel=True) == "emulated"


def test_apply_precision_builds_the_layer_of_the_format(gpu_of):
    from models.quant.fp8_torch import TorchFp8Linear
    from models.quant.recipe import apply_precision

    def model():
        net = nn.Module()
        net.layers = nn.ModuleList([nn.Module()])
        net.layers[0].symbol = "-"
        net.layers[0].mixer = nn.Module()
        net.layers[0].mixer.up_proj = nn.Linear(128, 256, bias=False)
        return net

    for fmt, capability, linear_class in (("nvfp4", (10, 0), TorchNvfp4Linear), ("nvfp4_4over6", (12, 0),
                                          TorchNvfp4Linear), ("fp8_block", (9, 0), TorchFp8Linear)):
        net = model()
        plan = apply_precision(net, _precision(fmt, backend="auto"), device=gpu_of(capability), tensor_parallel=True)
        layer = net.layers[0].mixer.up_proj
        assert plan.backend == "torch" and type(layer) is linear_class, (fmt, type(layer))
        assert any(linear_class.__name__ in note for note in plan.notes)
    assert layer.spec == fp8_block_linear_spec()
    net = model()
    apply_precision(net, _precision("nvfp4_4over6"), device=gpu_of((10, 0)))
    assert net.layers[0].mixer.up_proj.spec.fprop.a.four_over_six == "mse"
