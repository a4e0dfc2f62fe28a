"""Where our NVFP4 bits differ from Transformer Engine's own code, each difference pinned down.

1. TE's standalone dequantize kernel (dequantize_nvfp4.cuh) computes the block factor as
   (s_b * amax) * fp32(1/2688); our dequantize() and the emulated GEMM use q * s_b, then 1/S_enc.
   ``QuantizedTensor.dequantize_te_standalone`` reproduces TE's order: checked bit for bit against
   an independent numpy/ml_dtypes oracle, and shown to differ from ours in the last fp32 bits only.
2. A scaled value of -0.0 gets E2M1 code 8 (-0) from us, code 0 (+0) from TE's pure-torch reference
   quantizer (cast_to_fp4x2). Everything else stores the same codes; decoded values are equal as
   numbers, and GEMM outputs are bit-identical.
See docs/numerics.md, "NVFP4 and TE: where the bits differ".
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from models.quant.formats import fake_quantize, quantize

import quant_oracles as oracle

SCALES = (1e-39, 2.0**-60, 1e-3, 1.0, 3e4, 2.0**90)


def _bits_equal(actual: torch.Tensor, expected: np.ndarray, what: str):
    """Same fp32 bits (signed zeros included); NaN exactly where expected is NaN."""
    actual = actual.detach().float().numpy()
    expected = expected.astype(np.float32)
    nan = np.isnan(expected)
    assert np.array_equal(np.isnan(actual), nan), f"{what}: NaN pattern differs"
    differ = actual[~nan].view(np.int32) != expected[~nan].view(np.int32)
    assert not differ.any(), (
        f"{what}: {differ.sum()} of {differ.size} differ, e.g. got {actual[~nan][differ][:5]} "
        f"expected {expected[~nan][differ][:5]}"
    )


# ------------------------------------------------------------------------------------------------
# 1. TE's standalone dequantize


@pytest.mark.parametrize("tile", [(1, 16), (16, 16)])
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_te_standalone_matches_oracle(dtype, scale, tile):
    """Fresh inputs at every scale (outliers, subnormal and zero block scales), fp32 and bf16 out."""
    if dtype == torch.bfloat16 and scale == 1e-39:
        scale = 1e-37  # bf16 keeps fewer subnormal bits; stay where the input is still varied
    x = oracle.fresh_input(64, 96, scale, dtype)
    quantized = quantize(x, "nvfp4", tile=tile)
    expected = oracle.nvfp4_te_standalone_dequantize(oracle.to_numpy_f32(x), tile)
    assert quantized.amax.dtype == torch.float32 and quantized.amax.shape == ()
    assert quantized.amax.item() == np.abs(oracle.to_numpy_f32(x)).max()
    _bits_equal(quantized.dequantize_te_standalone(torch.float32), expected, "TE dequantize, fp32")
    # TE casts the fp32 product to the output type (RNE): ml_dtypes' bf16 cast is the oracle
    expected_bf16 = expected.astype(ml_dtypes.bfloat16).astype(np.float32)
    out_bf16 = quantized.dequantize_te_standalone(torch.bfloat16)
    assert out_bf16.dtype == torch.bfloat16
    _bits_equal(out_bf16, expected_bf16, "TE dequantize, bf16")
    assert quantized.dequantize_te_standalone().dtype == dtype  # default: the input's dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_te_standalone_dequantize_differs_from_ours_in_the_last_fp32_bits(dtype):
    """The difference docs/numerics.md states: real (many elements), yet a few ulp at most.

    Ours: fp32(q * s_b) * fp32(1 / fp32(2688 / amax)); TE: q * fp32(fp32(s_b * amax) * fp32(1/2688)).
    Each side has at most 3-4 roundings of relative size 2^-24 from the exact q * s_b * amax / 2688,
    so they can differ by at most 7 fp32 ulp; the sign and the zeros are always the same.
    """
    x = oracle.fresh_input(256, 512, 1.0, dtype)
    quantized = quantize(x, "nvfp4")
    ours = quantized.dequantize(torch.float32)
    theirs = quantized.dequantize_te_standalone(torch.float32)
    assert torch.equal(ours == 0, theirs == 0) and torch.equal(ours < 0, theirs < 0)
    nonzero = ours != 0
    ulps = (ours.view(torch.int32) - theirs.view(torch.int32))[nonzero].abs()
    assert ulps.max() <= 7, ulps.max()
    fraction = (ulps > 0).float().mean().item()
    assert fraction > 0.05, f"only {fraction:.3f} of the elements differ: is the documented difference gone?"
    # numerically they are the same tensor to fp32 rounding
    torch.testing.assert_close(theirs, ours, rtol=8 * 2.0**-24, atol=0)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_dequantize_te_standalone_non_finite_is_nan_everywhere(bad):
    """Our NaN policy holds here too: a NaN/Inf amax makes every block factor NaN (never clipped)."""
    x = torch.randn(16, 32)
    x[2, 5] = bad
    assert quantize(x, "nvfp4").dequantize_te_standalone().isnan().all()


def test_dequantize_te_standalone_is_nvfp4_only():
    with pytest.raises(ValueError, match="not for mxfp4"):
        quantize(torch.randn(4, 32), "mxfp4").dequantize_te_standalone()
    assert quantize(torch.randn(4, 32), "mxfp4").amax is None


# ------------------------------------------------------------------------------------------------
# 2. -0.0


def _with_negative_zeros(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Fresh random input with -0.0 scattered in, one whole block of -0.0 (s_b = 0, r_b = FLT_MAX)
    and small negatives that round to -0 (code 8 in both encoders)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=generator)
    scattered = torch.randperm(rows * cols, generator=generator)[: rows * cols // 10]
    x.view(-1)[scattered] = -0.0
    x[1, 16:32] = -0.0
    x[2, 0] = -1e-3  # v = x * r_b far below 0.25: rounds to -0
    return x


def test_negative_zero_codes_ours_and_te_reference():
    x = _with_negative_zeros(32, 64, seed=11)
    negative_zero = (x == 0) & torch.signbit(x)
    assert negative_zero.sum() > 64 and negative_zero[1, 16:32].all()
    quantized = quantize(x, "nvfp4")
    expected = oracle.nvfp4(oracle.to_numpy_f32(x))
    te_codes = torch.from_numpy(oracle.te_reference_e2m1_codes(expected["v"]))
    # ours: the sign of -0.0 is kept (code 8), as ml_dtypes' cast keeps it
    assert (quantized.codes[negative_zero] == 8).all()
    assert torch.equal(quantized.codes, torch.from_numpy(expected["codes"]))
    # TE's reference: code 0 for -0.0, and the same code as ours everywhere else
    assert (te_codes[negative_zero] == 0).all()
    assert torch.equal(quantized.codes[~negative_zero], te_codes[~negative_zero])
    assert quantized.codes[2, 0] == 8 and te_codes[2, 0] == 8  # a negative rounded to zero: -0 in both
    # decoded: -0.0 (ours) against +0.0 (TE's reference), equal as numbers
    ours = quantized.dequantize(torch.float32)
    te_values = (oracle.decode_e2m1_codes(te_codes.numpy()) * np.repeat(expected["s_b"], 16, axis=1)).astype(
        np.float32
    ) * expected["decode"]
    te_values = torch.from_numpy(te_values.astype(np.float32))
    assert torch.signbit(ours[negative_zero]).all() and not torch.signbit(te_values[negative_zero]).any()
    assert (ours == te_values).all()
    # the values path (what the emulated GEMM uses) keeps -0.0 as the codes path does
    assert torch.signbit(fake_quantize(x, "nvfp4")[negative_zero]).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_negative_zero_gemm_outputs_are_bit_identical(seed):
    """An emulated GEMM (q * s_b products, fp32 sums, then both decode scales, as models/quant/linear.py
    orders it) gives the same bits whether X's -0.0 was stored as -0 (ours) or +0 (TE's reference):
    a signed zero adds exactly nothing to a nonzero sum."""
    x = _with_negative_zeros(48, 64, seed=seed)
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(100 + seed))
    qx, qw = quantize(x, "nvfp4"), quantize(w, "nvfp4", tile=(16, 16))
    ours = qx.scaled_values(torch.float32)
    expected = oracle.nvfp4(oracle.to_numpy_f32(x))
    te_codes = oracle.te_reference_e2m1_codes(expected["v"])
    te = torch.from_numpy(
        (oracle.decode_e2m1_codes(te_codes) * np.repeat(expected["s_b"], 16, axis=1)).astype(np.float32)
    )
    negative_zero = (x == 0) & torch.signbit(x)
    assert torch.signbit(ours[negative_zero]).all() and not torch.signbit(te[negative_zero]).any()
    decode = qx.tensor_scale * qw.tensor_scale
    y_ours = (ours @ qw.scaled_values(torch.float32).t()) * decode
    y_te = (te @ qw.scaled_values(torch.float32).t()) * decode
    assert (y_ours != 0).all()  # the only case a zero's sign could show: an output that is exactly 0
    assert torch.equal(y_ours.view(torch.int32), y_te.view(torch.int32))
