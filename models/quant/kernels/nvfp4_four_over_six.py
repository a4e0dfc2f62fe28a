"""Triton helpers of NVFP4 Four Over Six (``models.quant.formats.four_over_six``): each block's two
candidate scales, their errors and the choice, in TE's fp32 arithmetic and order.

The kernels of ``kernels.nvfp4`` hold a block's 16 elements as 16 tensors (element j of every block:
``x0 .. x15``), as TE's 4over6 kernel holds one block per thread, so that a candidate's error is the
fp32 sum element 0 + element 1 + ... + element 15 in that order; a 16x16 tile then adds its 16 row
sums as TE's warp reduction does (rows i and i + 8, then i and i + 4, ...: ``tile_sum_of_rows``).

ERROR (a constexpr): 1 = MSE (sum of d^2), 2 = MAE (sum of |d|), d = ((q * s_k) * amax) / 1536 - x.
Literals: 1536 = 256 * 6 (Four Over Six's S_enc numerator), 3.4028234663852886e38 = FLT_MAX.
"""

from __future__ import annotations

from models.quant.kernels.triton_common import tl, triton

FOUR_OVER_SIX_ERROR_CODES = {None: 0, "mse": 1, "mae": 2}
"""OperandSpec.four_over_six -> the kernels' FOUR_OVER_SIX constexpr (0: off)."""


def four_over_six_code(four_over_six) -> int:
    """The FOUR_OVER_SIX constexpr of ``four_over_six`` (None, "mse", "mae"); ValueError otherwise."""
    if four_over_six not in FOUR_OVER_SIX_ERROR_CODES:
        raise ValueError(f"four_over_six must be None, 'mse' or 'mae', got {four_over_six!r}")
    return FOUR_OVER_SIX_ERROR_CODES[four_over_six]

if triton is not None:
    # Imported under their own names: Inductor splices each jit helper's source under its __name__.
    from models.quant.kernels.fp4_common import round_e2m1
    from models.quant.kernels.triton_common import e4m3_round

    @triton.jit
    def block_reciprocal(scale, decode):
        """r_b = min(1 / (s_b * S_dec), FLT_MAX); NaN stays NaN."""
        reciprocal = tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale * decode)
        return tl.where(reciprocal > 3.4028234663852886e38, 3.4028234663852886e38, reciprocal)

    @triton.jit
    def candidate_scales(block_amax, encode, decode):
        """TE's compute_scale_pair: base = (block_amax / 6) * S_enc; s4 = e4m3(base * 1.5), s6 = e4m3(base)
        (RNE, saturating at 448). Returns (s4, code4, r4, s6, code6, r6)."""
        base = tl.math.div_rn(block_amax, tl.full(block_amax.shape, 6.0, tl.float32)) * encode
        scale_4, code_4 = e4m3_round(base * 1.5)
        scale_6, code_6 = e4m3_round(base)
        return (scale_4, code_4, block_reciprocal(scale_4, decode),
                scale_6, code_6, block_reciprocal(scale_6, decode))

    @triton.jit
    def add_error(total, x, scale, reciprocal, amax, ERROR: tl.constexpr):
        """total + the error of one element quantized with (s, r): d = ((q * s) * amax) / 1536 - x."""
        q, _ = round_e2m1(x * reciprocal, x, False)
        difference = tl.math.div_rn((q * scale) * amax, tl.full(x.shape, 1536.0, tl.float32)) - x
        if ERROR == 1:
            error = difference * difference
        else:
            error = tl.abs(difference)
        return total + error

    @triton.jit
    def candidate_error_16(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
                           scale, reciprocal, amax, ERROR: tl.constexpr):
        """The error of every block quantized with (s, r): element 0's error + element 1's + ... in order."""
        total = tl.zeros(x0.shape, tl.float32)
        total = add_error(total, x0, scale, reciprocal, amax, ERROR)
        total = add_error(total, x1, scale, reciprocal, amax, ERROR)
        total = add_error(total, x2, scale, reciprocal, amax, ERROR)
        total = add_error(total, x3, scale, reciprocal, amax, ERROR)
        total = add_error(total, x4, scale, reciprocal, amax, ERROR)
        total = add_error(total, x5, scale, reciprocal, amax, ERROR)
        total = add_error(total, x6, scale, reciprocal, amax, ERROR)
        total = add_error(total, x7, scale, reciprocal, amax, ERROR)
        total = add_error(total, x8, scale, reciprocal, amax, ERROR)
        total = add_error(total, x9, scale, reciprocal, amax, ERROR)
        total = add_error(total, x10, scale, reciprocal, amax, ERROR)
        total = add_error(total, x11, scale, reciprocal, amax, ERROR)
        total = add_error(total, x12, scale, reciprocal, amax, ERROR)
        total = add_error(total, x13, scale, reciprocal, amax, ERROR)
        total = add_error(total, x14, scale, reciprocal, amax, ERROR)
        total = add_error(total, x15, scale, reciprocal, amax, ERROR)
        return total

    @triton.jit
    def halves_added(row_sums, HALF: tl.constexpr):
        """[2 HALF, N] -> [HALF, N]: row i + row i + HALF."""
        pairs = tl.permute(tl.reshape(row_sums, [2, HALF, row_sums.shape[1]]), (1, 2, 0))
        first, second = tl.split(pairs)
        return first + second

    @triton.jit
    def tile_sum_of_rows(row_sums):
        """[16, N] row sums of N 16x16 tiles -> [N] tile sums, added as a tree: rows i + (i + 8), then
        i + (i + 4), i + (i + 2), i + (i + 1) (TE's reduce_group_sum_16)."""
        total = halves_added(row_sums, 8)
        total = halves_added(total, 4)
        total = halves_added(total, 2)
        total = halves_added(total, 1)
        return tl.reshape(total, [row_sums.shape[1]])

    @triton.jit
    def choose(error_4, error_6, scale_4, code_4, reciprocal_4, scale_6, code_6, reciprocal_6):
        """(s_b, code, r_b) of the lower-error candidate; a tie (or NaN) keeps map-to-6."""
        map_to_4 = error_4 < error_6
        return (tl.where(map_to_4, scale_4, scale_6), tl.where(map_to_4, code_4, code_6),
                tl.where(map_to_4, reciprocal_4, reciprocal_6))

    @triton.jit
    def block_choice(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
                     block_amax, encode, decode, amax, ERROR: tl.constexpr):
        """(s_b, code, r_b) of every 16-element block (x_j: element j of each; block_amax: their max |x|)."""
        scale_4, code_4, reciprocal_4, scale_6, code_6, reciprocal_6 = candidate_scales(block_amax, encode, decode)
        error_4 = candidate_error_16(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
                                     scale_4, reciprocal_4, amax, ERROR)
        error_6 = candidate_error_16(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
                                     scale_6, reciprocal_6, amax, ERROR)
        return choose(error_4, error_6, scale_4, code_4, reciprocal_4, scale_6, code_6, reciprocal_6)
