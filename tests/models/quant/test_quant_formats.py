"""models.quant.formats against independent ml_dtypes oracles, element by element."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from models.quant import formats
from models.quant.formats import elements
from models.quant.formats import fake_quantize, quantize, quantize_scaled_values

import quant_oracles as oracle

SCALES = (1e-39, 2.0**-60, 1e-3, 1.0, 3e4, 2.0**90)


def _assert_same_bits(actual: torch.Tensor, expected: torch.Tensor, what: str):
    """Equal bit for bit (signed zeros included); NaN where and only where expected is NaN."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, what
    actual, expected = actual.float(), expected.float()  # exact for bf16/fp16
    nan = expected.isnan()
    assert torch.equal(actual.isnan(), nan), f"{what}: NaN in {(actual.isnan() != nan).sum()} other places"
    differ = actual[~nan].view(torch.int32) != expected[~nan].view(torch.int32)
    assert not differ.any(), (
        f"{what}: {differ.sum()} of {differ.numel()} differ, e.g. got {actual[~nan][differ][:5].tolist()} "
        f"expected {expected[~nan][differ][:5].tolist()}"
    )


def _assert_equal(actual: torch.Tensor, expected: np.ndarray, what: str):
    actual_np = actual.detach().float().cpu().numpy()
    mismatch = ~((actual_np == expected) | (np.isnan(actual_np) & np.isnan(expected)))
    assert not mismatch.any(), (
        f"{what}: {mismatch.sum()} of {mismatch.size} differ, e.g. got {actual_np[mismatch][:5]} "
        f"expected {expected[mismatch][:5]}"
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("tile", [(1, 16), (16, 16)])
def test_nvfp4_rne_matches_ml_dtypes(dtype, scale, tile):
    if dtype == torch.bfloat16 and scale == 1e-39:
        scale = 1e-37  # bf16 keeps fewer subnormal bits; stay where the input is still varied
    x = oracle.fresh_input(48, 64, scale, dtype)
    quantized = quantize(x, "nvfp4", tile=tile)
    expected = oracle.nvfp4(oracle.to_numpy_f32(x), tile)
    assert quantized.codes.dtype == torch.uint8 and quantized.codes.shape == (48, 64)
    assert quantized.block_scales.dtype == torch.float8_e4m3fn
    assert quantized.block_scales.shape == (48 // tile[0], 64 // tile[1])
    _assert_equal(quantized.codes, expected["codes"].astype(np.float32), "E2M1 codes")
    _assert_equal(quantized.block_scales.float(), expected["s_b"], "E4M3 block scales")
    _assert_equal(quantized.tensor_scale, np.array(expected["decode"]), "decode scale")
    _assert_equal(quantized.dequantize(torch.float32), expected["xhat"], "dequantized")
    _assert_equal(quantized.scaled_values(torch.float32), expected["scaled"], "scaled values")
    # scaled values q * s_b are exact in bf16
    _assert_equal(quantized.scaled_values(torch.bfloat16), expected["scaled"], "scaled values in bf16")
    fake = fake_quantize(x, "nvfp4", tile=tile)
    assert fake.dtype == dtype and fake.shape == x.shape
    assert torch.equal(fake, quantized.dequantize())


def test_nvfp4_ties_round_half_to_even():
    """Exact ties, which random data almost never hits, in both the E2M1 elements and the E4M3 scales.

    Tensor amax 7 gives S_enc = 2688 / 7 = 384 and S_enc * (1/6) = 64 exactly in fp32, so a block's
    s_b = e4m3(block_amax * 64). Block 0 (amax 3) gets s_b = 192, r_b = 1 / (192 / 384) = 2: its
    elements t / 2 land exactly on the E2M1 ties t. Blocks 1-3 put block_amax * 64 on E4M3 ties.
    """
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    block0 = torch.tensor([3.0] + [t / 2 for t in ties] + [-t / 2 for t in ties] + [0.0])
    block1 = torch.full((16,), 17 / 64)  # 17 between E4M3 16 and 18 -> 16
    block2 = torch.full((16,), 19 / 64)  # 19 between 18 and 20 -> 20
    block3 = torch.full((16,), 1.5 * 2.0**-15)  # 1.5 * 2^-9: between subnormals 2^-9 and 2^-8 -> 2^-8
    block4 = torch.zeros(16)
    block4[0] = 7.0
    x = torch.stack([block0, block1, block2, block3, block4]).reshape(1, 80)
    quantized = quantize(x, "nvfp4")
    assert quantized.tensor_scale.item() == np.float32(1.0) / np.float32(384.0)
    assert quantized.block_scales.float()[0].tolist() == [192.0, 16.0, 20.0, 2.0**-8, 448.0]
    expected_elements = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]  # RNE: 0.25->0, 0.75->1, 1.25->1, ...
    elements = quantized.element_values()[0, :16].tolist()
    assert elements == [6.0] + expected_elements + [-e for e in expected_elements] + [0.0]
    expected = oracle.nvfp4(oracle.to_numpy_f32(x))
    _assert_equal(quantized.dequantize(), expected["xhat"], "dequantized ties")
    _assert_equal(quantized.codes, expected["codes"].astype(np.float32), "codes at ties")
    # the values path rounds the same ties the same way
    _assert_same_bits(fake_quantize(x, "nvfp4"), quantized.dequantize(), "fake_quantize at ties")
    values, _ = quantize_scaled_values(x, "nvfp4", dtype=torch.float32)
    _assert_same_bits(values, quantized.scaled_values(torch.float32), "scaled values at ties")


def test_nvfp4_tiny_blocks_give_subnormal_and_zero_scales():
    """The fresh inputs must really exercise E4M3 subnormal (< 2^-6) and zero block scales."""
    x = oracle.fresh_input(32, 64, 1.0, torch.float32)
    x[5, 16:32] = torch.randn(16) * 1e-3  # block amax ~ 3e-3 of the tensor's: s_b ~ 448 * 1e-3 / 50 subnormal
    scales = quantize(x, "nvfp4").block_scales.float()
    assert ((scales > 0) & (scales < 2.0**-6)).any()
    assert (scales == 0).any()
    expected = oracle.nvfp4(oracle.to_numpy_f32(x))
    _assert_equal(quantize(x, "nvfp4").dequantize(), expected["xhat"], "dequantized")


def test_nvfp4_zero_tensor():
    x = torch.zeros(16, 32)
    quantized = quantize(x, "nvfp4")
    assert quantized.tensor_scale.item() == 1.0  # S_enc = 1 when amax == 0
    assert torch.equal(quantized.dequantize(), x)
    assert (quantized.codes == 0).all()


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
@pytest.mark.parametrize("scale", SCALES)
def test_mx_rne_matches_ml_dtypes(fmt, scale):
    x = oracle.fresh_input(24, 128, scale, torch.float32, block=32)
    quantized = quantize(x, fmt)
    expected = oracle.mx(oracle.to_numpy_f32(x), fmt)
    assert quantized.block_scales.dtype == torch.float8_e8m0fnu
    assert torch.equal(
        quantized.block_scales.view(torch.uint8), torch.from_numpy(expected["scale_codes"].copy())
    )
    _assert_equal(quantized.dequantize(), expected["xhat"], f"{fmt} dequantized")
    assert torch.equal(fake_quantize(x, fmt), quantized.dequantize())


def test_mx_zero_block_takes_smallest_scale():
    x = torch.randn(2, 64)
    x[1, :32] = 0
    quantized = quantize(x, "mxfp4")
    assert quantized.block_scales.view(torch.uint8)[1, 0].item() == 0  # E8M0 code 0 = 2^-127
    assert (quantized.dequantize()[1, :32] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tile", [(1, 128), (128, 128)])
@pytest.mark.parametrize("power_of_two", [True, False])
@pytest.mark.parametrize("scale", SCALES)
def test_fp8_block_matches_ml_dtypes(dtype, tile, power_of_two, scale):
    if dtype == torch.bfloat16 and scale == 1e-39:
        scale = 1e-37
    x = oracle.fresh_input(128, 256, scale, dtype, block=128)
    quantized = quantize(x, "fp8_block", tile=tile, power_of_two_scales=power_of_two)
    expected = oracle.fp8_scaled(
        oracle.to_numpy_f32(x), tile, power_of_two=power_of_two, value_for_inf=torch.finfo(dtype).max
    )
    assert quantized.codes.dtype == torch.float8_e4m3fn
    _assert_equal(quantized.block_scales, expected["decode"], "fp8_block decode scales")
    _assert_equal(quantized.dequantize(torch.float32), expected["xhat"], "fp8_block dequantized")
    # fp8_block has no per-tensor scale: the scaled values are the dequantized values
    _assert_equal(quantized.scaled_values(torch.float32), expected["xhat"], "fp8_block scaled values")
    if power_of_two:
        mantissa, _ = torch.frexp(quantized.block_scales)
        assert (mantissa == 0.5).all()
        assert quantized.scaled_values_exact_in(torch.bfloat16)
        if 1e-3 <= scale <= 3e4:  # away from bf16's subnormal range, 4-bit q * 2^k is exact in bf16
            _assert_equal(quantized.scaled_values(torch.bfloat16), expected["xhat"], "scaled values in bf16")
    else:
        assert not quantized.scaled_values_exact_in(torch.bfloat16)


def test_fp8_block_tiny_amax_uses_input_dtype_max():
    """448 / amax overflows for a subnormal amax: TE takes the input dtype's max finite value."""
    x = torch.full((1, 128), 1e-39)
    quantized = quantize(x, "fp8_block", power_of_two_scales=False)
    assert quantized.block_scales.item() == np.float32(1.0) / np.float32(torch.finfo(torch.float32).max)


@pytest.mark.parametrize("scale", SCALES)
def test_fp8_tensor_matches_ml_dtypes(scale):
    x = oracle.fresh_input(32, 48, scale, torch.float32)
    quantized = quantize(x, "fp8_tensor")
    expected = oracle.fp8_scaled(oracle.to_numpy_f32(x), None, power_of_two=False, value_for_inf=oracle.FLT_MAX)
    _assert_equal(quantized.tensor_scale, expected["decode"].reshape(()), "fp8_tensor decode scale")
    _assert_equal(quantized.dequantize(), expected["xhat"], "fp8_tensor dequantized")
    assert torch.equal(quantized.scaled_values(torch.bfloat16).float(), quantized.codes.float())


def test_leading_dims_are_flattened():
    x = torch.randn(3, 5, 32)
    quantized = quantize(x, "nvfp4")
    assert quantized.codes.shape == (15, 32) and quantized.dequantize().shape == (3, 5, 32)
    assert torch.equal(quantized.dequantize().reshape(15, 32), fake_quantize(x.reshape(15, 32), "nvfp4"))


def test_packed_codes_low_nibble_first():
    x = torch.randn(4, 32)
    quantized = quantize(x, "nvfp4")
    packed = quantized.packed_codes()
    assert packed.shape == (4, 16) and packed.dtype == torch.uint8
    assert torch.equal(packed & 15, quantized.codes[:, 0::2])
    assert torch.equal(packed >> 4, quantized.codes[:, 1::2])


# ------------------------------------------------------------------------------------------------
# Stochastic rounding


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_stochastic_rounding_unbiased_and_neighbouring(fmt):
    block = 16 if fmt == "nvfp4" else 32
    draws = 20000
    row = torch.randn(1, block) * 3
    x = row.expand(draws, block).contiguous()  # every row is an independent draw of the same block
    generator = torch.Generator().manual_seed(7)
    quantized = quantize(x, fmt, rounding="stochastic", generator=generator)
    q = quantized.element_values()  # [draws, block]: grid values before scaling
    # The scaled input v = x * r_b, recomputed from the stored scales (identical in every row).
    scale = quantized.block_scales.float()[0]
    if fmt == "nvfp4":
        reciprocal = torch.minimum(1.0 / (scale * quantized.tensor_scale), torch.tensor(formats.FLT_MAX))
        v = (row * reciprocal).clamp(-6, 6)[0]
    else:
        v = (row / scale).clamp(-6, 6)[0]
    grid = torch.tensor(formats.E2M1_GRID)
    magnitude = v.abs()
    lower = grid[torch.searchsorted(grid, magnitude, right=True) - 1]
    upper = grid[torch.clamp(torch.searchsorted(grid, magnitude, right=True), max=7)]
    sign = torch.where(v < 0, -1.0, 1.0)
    # always one of the two neighbours
    assert ((q.abs() == lower) | (q.abs() == upper)).all()
    assert ((q == 0) | (torch.sign(q) == sign)).all()
    # unbiased: the mean is within 6 standard errors of v, plus 3 draws' worth of slack for tiny
    # round-up probabilities (where the normal approximation of the count is poor)
    variance = (upper - magnitude) * (magnitude - lower)
    standard_error = (variance / draws).sqrt()
    error = (q.mean(0) - v).abs()
    assert (error <= 6 * standard_error + 3 * (upper - lower) / draws + 1e-6).all(), (error, standard_error)
    # and it does round both ways somewhere (not secretly RNE)
    assert (q.std(0) > 0).any()


def test_stochastic_rounding_follows_the_documented_uniforms():
    """One uniform per element from torch.rand(rows, cols, generator); round up iff u < fraction."""
    x = oracle.fresh_input(32, 64, 1.0, torch.float32)
    quantized = quantize(x, "nvfp4", rounding="stochastic", generator=torch.Generator().manual_seed(3))
    uniform = torch.rand(32, 64, generator=torch.Generator().manual_seed(3)).numpy()
    expected = oracle.nvfp4(oracle.to_numpy_f32(x), (1, 16), uniform=uniform)
    _assert_equal(quantized.dequantize(), expected["xhat"], "SR dequantized")
    # different seeds draw differently
    other = quantize(x, "nvfp4", rounding="stochastic", generator=torch.Generator().manual_seed(4))
    assert not torch.equal(other.codes, quantized.codes)


def test_stochastic_rounding_rejected_for_fp8():
    with pytest.raises(ValueError, match="stochastic"):
        quantize(torch.randn(4, 128), "fp8_block", rounding="stochastic")


# ------------------------------------------------------------------------------------------------
# NaN / Inf


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8_tensor"])
def test_non_finite_poisons_per_tensor_formats(fmt, bad):
    x = torch.randn(16, 32)
    x[3, 7] = bad
    out = fake_quantize(x, fmt)
    assert out.isnan().all(), "a NaN/Inf anywhere makes the per-tensor scale NaN: everything NaN"
    assert quantize(x, fmt).tensor_scale.isnan()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize(
    "fmt,tile", [("mxfp4", None), ("mxfp8", None), ("fp8_block", (1, 128)), ("fp8_block", (128, 128))]
)
def test_non_finite_poisons_only_its_block(fmt, tile, bad):
    x = torch.randn(128, 256)
    x[3, 7] = bad
    out = fake_quantize(x, fmt, tile=tile)
    clean = x.clone()
    clean[3, 7] = 0.0
    reference = fake_quantize(clean, fmt, tile=tile)
    tile_rows, tile_cols = formats.resolve_tile(fmt, tile)
    poisoned = torch.zeros_like(x, dtype=torch.bool)
    first_row, first_col = (3 // tile_rows) * tile_rows, (7 // tile_cols) * tile_cols
    poisoned[first_row : first_row + tile_rows, first_col : first_col + tile_cols] = True
    assert out[poisoned].isnan().all(), "the block holding the NaN/Inf dequantizes to NaN (never clipped)"
    assert torch.equal(out[~poisoned], reference[~poisoned]), "other blocks are untouched"


def test_inf_is_never_clipped_to_a_finite_value():
    for fmt in formats.FORMATS:
        x = torch.ones(128, 128)
        x[0, 0] = math.inf
        assert not torch.isfinite(fake_quantize(x, fmt)[0, 0]), fmt


# ------------------------------------------------------------------------------------------------
# Shape and argument errors


def test_last_dim_not_divisible_names_layer_and_dim():
    with pytest.raises(ValueError, match=r"layers\.3\.mixer\.in_proj.*last dim 40.*block length 16"):
        quantize(torch.randn(4, 40), "nvfp4", name="layers.3.mixer.in_proj")


def test_2d_tile_leading_dim_not_divisible():
    with pytest.raises(ValueError, match=r"leading dim 24.*tile height 16"):
        quantize(torch.randn(2, 12, 32), "nvfp4", tile=(16, 16))


def test_bad_format_tile_and_rounding():
    with pytest.raises(ValueError, match="unknown format"):
        quantize(torch.randn(4, 32), "nvfp5")
    with pytest.raises(ValueError, match="does not support tile"):
        quantize(torch.randn(4, 32), "mxfp4", tile=(16, 16))
    with pytest.raises(ValueError, match="unknown rounding"):
        quantize(torch.randn(4, 32), "nvfp4", rounding="down")
    with pytest.raises(TypeError, match="dtype"):
        quantize(torch.randint(0, 4, (4, 32)), "nvfp4")


# ------------------------------------------------------------------------------------------------
# The values path (quantize_scaled_values, fake_quantize: no codes) against the codes path


VALUE_PATH_CASES = [
    ("nvfp4", (1, 16), "nearest", True),
    ("nvfp4", (1, 16), "stochastic", True),
    ("nvfp4", (16, 16), "nearest", True),
    ("nvfp4", (16, 16), "stochastic", True),
    ("mxfp4", None, "nearest", True),
    ("mxfp4", None, "stochastic", True),
    ("mxfp8", None, "nearest", True),
    ("fp8_block", (1, 128), "nearest", True),
    ("fp8_block", (1, 128), "nearest", False),
    ("fp8_block", (128, 128), "nearest", True),
    ("fp8_block", (128, 128), "nearest", False),
    ("fp8_tensor", None, "nearest", False),
]


def _poisoned(x: torch.Tensor) -> torch.Tensor:
    """x with a NaN, a +Inf and a -Inf in different blocks and rows, and some signed zeros."""
    x = x.clone()
    x[3, 7] = math.nan
    x[70, 200] = math.inf
    x[100, 40] = -math.inf
    x[5, 0:8] = -0.0
    return x


@pytest.mark.parametrize("memory_order", ["row_major", "transposed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt,tile,rounding,power_of_two", VALUE_PATH_CASES)
def test_values_path_equals_codes_path_bit_for_bit(fmt, tile, rounding, power_of_two, dtype, memory_order):
    """Fresh inputs at every scale (subnormal and zero block scales, outliers), signed zeros, NaN/Inf.

    Stochastic rounding: both paths draw the same uniforms from equally seeded generators. The
    transposed case is a column-major view (as the Wgrad operands are): same values, same bits.
    """
    for scale in SCALES:
        if dtype == torch.bfloat16 and scale == 1e-39:
            scale = 1e-37
        clean = oracle.fresh_input(128, 256, scale, dtype, block=16 if fmt == "nvfp4" else 32)
        for x in (clean, _poisoned(clean)):
            if memory_order == "transposed":
                x = x.t().contiguous().t()
                assert not x.is_contiguous()
            what = f"{fmt} {tile} {rounding} scale {scale} {'poisoned' if x.isnan().any() else 'clean'}"
            kwargs = dict(tile=tile, rounding=rounding, power_of_two_scales=power_of_two)
            reference = quantize(x, fmt, generator=torch.Generator().manual_seed(5), **kwargs)
            for values_dtype in (torch.float32, torch.bfloat16):
                values, tensor_scale = quantize_scaled_values(
                    x, fmt, generator=torch.Generator().manual_seed(5), dtype=values_dtype, **kwargs
                )
                _assert_same_bits(values, reference.scaled_values(values_dtype), f"{what}: scaled values")
                if reference.tensor_scale is None:
                    assert tensor_scale is None
                else:
                    _assert_same_bits(tensor_scale, reference.tensor_scale, f"{what}: tensor scale")
            fake = fake_quantize(x, fmt, generator=torch.Generator().manual_seed(5), **kwargs)
            _assert_same_bits(fake, reference.dequantize(), f"{what}: fake_quantize")


def _e2m1_probe_values() -> torch.Tensor:
    """|v| probing every E2M1 decision: ties, grid points and their fp32 neighbours, tiny and huge values."""
    points = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] + list(formats.E2M1_GRID) + [6.5, 7.0, 1e30]
    points = torch.tensor(points, dtype=torch.float32)
    up = torch.nextafter(points, torch.tensor(math.inf))
    down = torch.nextafter(points, torch.tensor(0.0))
    tiny = torch.tensor([1e-45, 1e-40, 2.0**-126, 1e-10, 0.0], dtype=torch.float32)
    spread = torch.rand(200, generator=torch.Generator().manual_seed(0)) * 6.5
    return torch.cat([points, up, down, tiny, spread]).clamp(max=7.9)


def test_e2m1_rounding_of_the_values_path_at_every_tie_and_boundary():
    """MXFP4 blocks whose amax is in [4, 8) have scale X = 1, so the elements are rounded as given.

    RNE: both paths against ml_dtypes' E2M1 cast; signs and signed zeros included.
    """
    magnitude = _e2m1_probe_values()
    row = torch.cat([magnitude, -magnitude])
    row = torch.cat([row, torch.zeros((-row.numel()) % 31)])  # 31 probes + one 6.0 per 32-block
    blocks = row.reshape(-1, 31)
    x = torch.cat([blocks, torch.full((blocks.shape[0], 1), 6.0)], dim=1).reshape(1, -1)
    quantized = quantize(x, "mxfp4")
    assert (quantized.block_scales.float() == 1.0).all()
    expected = oracle.e2m1_rne(oracle.to_numpy_f32(x))
    _assert_equal(quantized.dequantize(), expected, "codes path at E2M1 ties")
    _assert_same_bits(fake_quantize(x, "mxfp4"), quantized.dequantize(), "values path at E2M1 ties")
    assert torch.signbit(fake_quantize(torch.tensor([[-0.1] + [6.0] * 31]), "mxfp4")[0, 0])  # -0.1 -> -0.0


def test_e2m1_stochastic_rounding_of_the_values_path_with_crafted_uniforms():
    """u exactly at, just below and just above each fraction: round up iff u < frac, in both paths.

    Against the float64 oracle (ml_dtypes-free arithmetic of the documented rule) as well.
    """
    grid = torch.tensor(formats.E2M1_GRID)
    steps = torch.tensor([0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 2.0])
    fractions = torch.tensor([0.0, 2.0**-24, 0.25, 0.5, 0.75, 1 - 2.0**-24, 2.0**-20])
    # |v| = lo + frac * step for every grid interval and fraction (exact in fp32)
    magnitude = (grid[:7, None] + fractions[None, :] * steps[:, None]).reshape(-1)
    magnitude = torch.cat([magnitude, torch.tensor([6.0, 6.5, 0.0])])
    fraction = torch.cat([fractions.repeat(7), torch.zeros(3)])
    uniforms = [
        fraction,
        torch.nextafter(fraction, torch.tensor(0.0)),
        torch.nextafter(fraction, torch.tensor(1.0)).clamp(max=1 - 2.0**-24),
        torch.zeros_like(fraction),
    ]
    for v in (magnitude, -magnitude):
        for u in uniforms:
            codes = elements.round_e2m1(v, "stochastic", u)
            from_codes = torch.where(codes >= 8, -grid[(codes & 7).long()], grid[(codes & 7).long()])
            values = elements.round_e2m1_magnitude_(v.abs(), "stochastic", u).copysign_(v)
            _assert_same_bits(values, from_codes, "SR values path vs codes path")
            expected = oracle.e2m1_stochastic(v.numpy(), u.numpy())
            _assert_equal(values, expected, "SR values path vs float64 oracle")
    # the crafted uniforms really decide: u == frac stays down, u just below frac goes up
    at = elements.round_e2m1_magnitude_(torch.tensor([0.75]), "stochastic", torch.tensor([0.5]))
    below = elements.round_e2m1_magnitude_(torch.tensor([0.75]), "stochastic", torch.tensor([0.5 - 2.0**-25]))
    assert at.item() == 0.5 and below.item() == 1.0


def test_values_path_never_builds_codes(monkeypatch):
    """quantize_scaled_values / fake_quantize of E2M1 formats round arithmetically (no codes, no lookups)."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the values path built E2M1 codes")

    monkeypatch.setattr(elements, "round_e2m1", forbidden)
    x = torch.randn(32, 64)
    for fmt in ("nvfp4", "mxfp4"):
        for rounding in formats.ROUNDINGS:
            quantize_scaled_values(x, fmt, rounding=rounding)
            fake_quantize(x, fmt, rounding=rounding)
    with pytest.raises(AssertionError, match="built E2M1 codes"):
        quantize(x, "nvfp4")  # the codes path does, of course


def test_given_uniforms_round_as_the_generators_draws():
    """quantize(..., uniform=u) rounds with u exactly as with a generator that draws u (the form the
    MX kernels' reference takes); a wrong shape or rounding is refused."""
    x = torch.randn(8, 64)
    for fmt in ("nvfp4", "mxfp4"):
        drawn = quantize(x, fmt, rounding="stochastic", generator=torch.Generator().manual_seed(3))
        uniform = torch.rand(8, 64, generator=torch.Generator().manual_seed(3))
        given = quantize(x, fmt, rounding="stochastic", uniform=uniform)
        assert torch.equal(given.codes, drawn.codes) and torch.equal(given.dequantize(), drawn.dequantize()), fmt
    with pytest.raises(ValueError, match="uniform must be fp32"):
        quantize(x, "mxfp4", rounding="stochastic", uniform=torch.rand(8, 32))
    with pytest.raises(ValueError, match="rounding='stochastic'"):
        quantize(x, "mxfp4", uniform=torch.rand(8, 64))
