"""Triton helpers of NVFP4 Four Over Six (``models.quant.formats.four_over_six``): each block's two
candidate scales, their errors and the choice, in TE's fp32 arithmetic and order.

The kernels of ``kernels.nvfp4`` hold a block's 16 elements as 16 tensors (element j of every block:
``x0 .. x15``), as TE's 4over6 kernel holds one block per thread, so that a candidate's error is the
fp32 sum element 0 + element 1 + ... + element 15 in that order; a 16x16 tile then adds its 16 row
sums as TE's warp reduction does (rows i and i + 8, then i and i + 4, ...: ``tile_sum_of_rows``).

ERROR (a constexpr): 1 = MSE (sum of d^2), 2 = MAE (sum of |d|), d = ((q * s_k) * amax) / 1536 - x.
Literals: 1536 = 256 * 6 (Four Over Six's S_enc numerator), 3.4028234663852886e38 = FLT_MAX.

Each element's dequantized value without a division. Every E2M1 value is q = +-m * 2^e with m in
{1, 1.5} and e in {-1 .. 2}, and q * s is exact (at most 3 x 4 significant bits), so

    ((q * s) * amax) / 1536 = +-2^e * u_m,   u_m = ((m * s) * amax) / 1536   (each step rounded in fp32)

whenever no step leaves fp32's normal range, since scaling by a power of two commutes with rounding
there. A block computes its two units per candidate; an element takes 2^e (q's exponent bits) and u_m
by q's mantissa bit: a mask, a select and a multiply (``add_error_by_units``). When any
block of the program has a unit below 2^-120 or a product above 2^120 (a tensor amax near fp32's
range ends, or Inf/NaN), the program computes every element's quotient instead
(``candidate_error_16``). Both paths divide by 1536 with ``divide_by_1536`` (integer and fp64 steps,
exact for every fp32 input), not with a division instruction: its slow-path call would cost the
kernel registers (and occupancy) on every launch. Either way the result is the reference's bit for bit.

The rows orientation loads each block's 16 elements as 16-byte pieces, one per thread, and splits
them in registers (``load_16_elements``; ``store_16_elements`` joins them back): a load of element j
of every block instead would read 2 bytes out of every 32, a sixteenth of each memory transaction.
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
    def split_pairs(t):
        """[R, B, 2n] -> (t[..., 0::2], t[..., 1::2]), each [R, B, n] (n >= 2)."""
        return tl.split(tl.reshape(t, [t.shape[0], t.shape[1], t.shape[2] // 2, 2]))

    @triton.jit
    def split_8(t):
        """[R, B, 8] -> its 8 elements, each [R, B]. A split takes the lowest index bit each time."""
        even, odd = split_pairs(t)
        t0_mod4, t2_mod4 = split_pairs(even)
        t1_mod4, t3_mod4 = split_pairs(odd)
        t0, t4 = tl.split(t0_mod4)
        t2, t6 = tl.split(t2_mod4)
        t1, t5 = tl.split(t1_mod4)
        t3, t7 = tl.split(t3_mod4)
        return t0, t1, t2, t3, t4, t5, t6, t7

    @triton.jit
    def split_4(t):
        """[R, B, 4] -> its 4 elements, each [R, B]."""
        even, odd = split_pairs(t)
        t0, t2 = tl.split(even)
        t1, t3 = tl.split(odd)
        return t0, t1, t2, t3

    @triton.jit
    def join_8(t0, t1, t2, t3, t4, t5, t6, t7):
        """The inverse of split_8: [R, B, 8]. tl.join appends the fastest dimension, so the highest index
        bit is joined first."""
        by_bit1 = tl.join(tl.join(tl.join(t0, t4), tl.join(t2, t6)), tl.join(tl.join(t1, t5), tl.join(t3, t7)))
        return tl.reshape(by_bit1, [t0.shape[0], t0.shape[1], 8])

    @triton.jit
    def join_4(t0, t1, t2, t3):
        """The inverse of split_4: [R, B, 4]."""
        return tl.reshape(tl.join(tl.join(t0, t2), tl.join(t1, t3)), [t0.shape[0], t0.shape[1], 4])

    @triton.jit
    def load_piece(first, offset: tl.constexpr, mask, PIECE: tl.constexpr):
        """Elements offset .. offset + PIECE - 1 of every block, fp32 [R, B, PIECE] (first: [R, B] pointers to
        each block's element 0). A piece of 16 bytes is one vector load per thread."""
        lane = offset + tl.arange(0, PIECE)
        return tl.load(first[:, :, None] + lane[None, None, :], mask=mask[:, :, None], other=0.0).to(tl.float32)

    @triton.jit
    def load_16_elements(first, mask, PIECE: tl.constexpr):
        """Element j of every block as 16 tensors [R, B], loaded as pieces of PIECE contiguous elements
        (16 bytes: 8 bf16, 4 fp32), each held by one thread, so the splits stay in its registers."""
        if PIECE == 8:
            x0, x1, x2, x3, x4, x5, x6, x7 = split_8(load_piece(first, 0, mask, 8))
            x8, x9, x10, x11, x12, x13, x14, x15 = split_8(load_piece(first, 8, mask, 8))
        else:
            x0, x1, x2, x3 = split_4(load_piece(first, 0, mask, 4))
            x4, x5, x6, x7 = split_4(load_piece(first, 4, mask, 4))
            x8, x9, x10, x11 = split_4(load_piece(first, 8, mask, 4))
            x12, x13, x14, x15 = split_4(load_piece(first, 12, mask, 4))
        return x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15

    @triton.jit
    def store_16_elements(first, mask, x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
                          PIECE: tl.constexpr):
        """Store element j of every block ([R, B] each, cast to first's type) at first + j, in pieces."""
        dtype = first.dtype.element_ty
        if PIECE == 8:
            lane = tl.arange(0, 8)
            tl.store(first[:, :, None] + lane[None, None, :], join_8(x0, x1, x2, x3, x4, x5, x6, x7).to(dtype),
                     mask=mask[:, :, None])
            tl.store(first[:, :, None] + 8 + lane[None, None, :],
                     join_8(x8, x9, x10, x11, x12, x13, x14, x15).to(dtype), mask=mask[:, :, None])
        else:
            lane = tl.arange(0, 4)
            tl.store(first[:, :, None] + lane[None, None, :], join_4(x0, x1, x2, x3).to(dtype), mask=mask[:, :, None])
            tl.store(first[:, :, None] + 4 + lane[None, None, :], join_4(x4, x5, x6, x7).to(dtype),
                     mask=mask[:, :, None])
            tl.store(first[:, :, None] + 8 + lane[None, None, :], join_4(x8, x9, x10, x11).to(dtype),
                     mask=mask[:, :, None])
            tl.store(first[:, :, None] + 12 + lane[None, None, :], join_4(x12, x13, x14, x15).to(dtype),
                     mask=mask[:, :, None])

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
    def divide_by_1536(product):
        """RN32(p / 1536) of every fp32 p (subnormal, zero, Inf, NaN included) by integer and fp64 steps, no
        division instruction: p = +-m * 2^e (m the 24-bit significand), m = 3 k + rem exactly, and
        p / 1536 = (k + rem / 3) * 2^(e - 9). In fp64, k + RN64(rem / 3) is within 2^-30 of k + rem / 3
        (k < 2^23), while k + rem / 3 (rem > 0) lies at least 1/24 of a unit from every fp32 rounding
        midpoint (multiples of 1/8 of a unit there, or coarser for subnormal quotients), so the final RN32
        rounds it as it rounds the exact quotient; rem = 0 is exact throughout. Branch-free and without
        the division's slow-path call, whose registers a kernel would pay for even where it never runs."""
        bits = product.to(tl.int32, bitcast=True)
        biased = (bits >> 23) & 255
        significand = (bits & 8388607) | tl.where(biased != 0, 8388608, 0)
        third = significand // 3
        remainder = significand - 3 * third
        fraction = tl.where(remainder == 1, tl.full(product.shape, 1.0 / 3.0, tl.float64),
                            tl.where(remainder == 2, tl.full(product.shape, 2.0 / 3.0, tl.float64),
                                     tl.zeros(product.shape, tl.float64)))
        # 2^(e - 9) with e = max(biased, 1) - 150 (the significand's weight), built in fp64's exponent field
        weight = ((tl.maximum(biased, 1) - 159 + 1023).to(tl.int64) << 52).to(tl.float64, bitcast=True)
        quotient = ((third.to(tl.float64) + fraction) * weight).to(tl.float32)
        quotient = (quotient.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)  # p's sign
        return tl.where(biased == 255, product, quotient)  # Inf / 1536 = Inf; NaN stays NaN

    @triton.jit
    def add_error(total, x, scale, reciprocal, amax, ERROR: tl.constexpr):
        """total + the error of one element quantized with (s, r): d = ((q * s) * amax) / 1536 - x."""
        q, _ = round_e2m1(x * reciprocal, x, False)
        difference = divide_by_1536((q * scale) * amax) - x
        if ERROR == 1:
            error = difference * difference
        else:
            error = tl.abs(difference)
        return total + error

    @triton.jit
    def dequantization_units(scale, amax):
        """(u_1, u_1.5, exact) of every block's candidate scale s: u_m = ((m * s) * amax) / 1536, and whether
        +-2^e * u_m is the division's result for every E2M1 value (see the module docstring): all zero, or
        u_1 >= 2^-120 and (1.5 s) * amax <= 2^120 (so 4 * u_1.5 * 1536 stays finite and 0.5 * u_1 normal)."""
        product_1 = scale * amax
        product_15 = (scale * 1.5) * amax
        unit_1 = divide_by_1536(product_1)
        unit_15 = divide_by_1536(product_15)
        exact = ((product_1 == 0.0) & (product_15 == 0.0)) | (
            (unit_1 >= 7.52316384526264e-37) & (product_15 <= 1.329227995784916e36))  # 2^-120, 2^120
        return unit_1, unit_15, exact

    @triton.jit
    def add_error_by_units(total, x, reciprocal, unit_1, unit_15, ERROR: tl.constexpr):
        """total + the error of one element with reciprocal r >= 0 and the block's units, on magnitudes:
        |q| = e2m1(|x| * r) (RNE: round_e2m1's addition of 2^(e+22)), d = 2^e * u_m - |x|. q takes x's
        sign, so this d is the signed one negated or equal: the same d^2 and |d|. A NaN |x| * r gives a
        NaN error, as the signed form's q = 0 does (d = 0 - NaN)."""
        magnitude = tl.abs(x)
        scaled = magnitude * reciprocal
        scaled = tl.where(scaled > 6.0, 6.0, scaled)
        exponent = scaled.to(tl.int32, bitcast=True) >> 23
        magic = ((tl.maximum(exponent, 127) + 22) << 23).to(tl.float32, bitcast=True)
        bits = ((scaled + magic) - magic).to(tl.int32, bitcast=True)
        power_of_two = (bits & 2139095040).to(tl.float32, bitcast=True)  # exponent bits: 2^e (or 0)
        unit = tl.where((bits & 4194304) != 0, unit_15, unit_1)  # mantissa bit: m = 1.5
        difference = power_of_two * unit - magnitude
        if ERROR == 1:
            error = difference * difference
        else:
            error = tl.abs(difference)
        return total + error

    @triton.jit
    def add_error_either(total, x, reciprocal, first, second, BY_UNITS: tl.constexpr, ERROR: tl.constexpr):
        """add_error_by_units(first = u_1, second = u_1.5) if BY_UNITS, else add_error(first = s, second = amax)."""
        if BY_UNITS:
            total = add_error_by_units(total, x, reciprocal, first, second, ERROR)
        else:
            total = add_error(total, x, first, reciprocal, second, ERROR)
        return total

    @triton.jit
    def candidate_error_16(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
                           reciprocal, first, second, BY_UNITS: tl.constexpr, ERROR: tl.constexpr):
        """The error of every block quantized with reciprocal r: element 0's error + element 1's + ... in
        order, each by the block's units (BY_UNITS: first, second = u_1, u_1.5) or by its own quotient
        (first, second = s, amax)."""
        total = tl.zeros(x0.shape, tl.float32)
        total = add_error_either(total, x0, reciprocal, first, second, BY_UNITS, ERROR)
        total = add_error_either(total, x1, reciprocal, first, second, BY_UNITS, ERROR)
        total = add_error_either(total, x2, reciprocal, first, second, BY_UNITS, ERROR)
        total = add_error_either(total, x3, reciprocal, first, second, BY_UNITS, ERROR)
        total = add_error_either(total, x4, reciprocal, first, second, BY_UNITS, ERROR)
        total = add_error_either(total, x5, reciprocal, first, second, BY_UNITS, ERROR)
        total = add_error_either(total, x6, reciprocal, first, second, BY_UNITS, ERROR)
        total = add_error_either(total, x7, reciprocal, first, second, BY_UNITS, ERROR)
        total = add_error_either(total, x8, reciprocal, first, second, BY_UNITS, ERROR)
        total = add_error_either(total, x9, reciprocal, first, second, BY_UNITS, ERROR)
        total = add_error_either(total, x10, reciprocal, first, second, BY_UNITS, ERROR)
        total = add_error_either(total, x11, reciprocal, first, second, BY_UNITS, ERROR)
        total = add_error_either(total, x12, reciprocal, first, second, BY_UNITS, ERROR)
        total = add_error_either(total, x13, reciprocal, first, second, BY_UNITS, ERROR)
        total = add_error_either(total, x14, reciprocal, first, second, BY_UNITS, ERROR)
        total = add_error_either(total, x15, reciprocal, first, second, BY_UNITS, ERROR)
        return total

    @triton.jit
    def candidate_errors(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
                         scale_4, reciprocal_4, scale_6, reciprocal_6, amax, ERROR: tl.constexpr):
        """(error_4, error_6) of every block: by the units where every block of the program allows
        it (``dequantization_units``), else by a division per element. scale_k / reciprocal_k broadcast
        against x_j ([1, N] for the 16x16 tiles of the rows kernel)."""
        unit_1_4, unit_15_4, exact_4 = dequantization_units(scale_4, amax)
        unit_1_6, unit_15_6, exact_6 = dequantization_units(scale_6, amax)
        if tl.min((exact_4 & exact_6).to(tl.int32)) == 1:
            error_4 = candidate_error_16(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
                                         reciprocal_4, unit_1_4, unit_15_4, True, ERROR)
            error_6 = candidate_error_16(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
                                         reciprocal_6, unit_1_6, unit_15_6, True, ERROR)
        else:
            error_4 = candidate_error_16(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
                                         reciprocal_4, scale_4, amax, False, ERROR)
            error_6 = candidate_error_16(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
                                         reciprocal_6, scale_6, amax, False, ERROR)
        return error_4, error_6

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
        error_4, error_6 = candidate_errors(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
                                            scale_4, reciprocal_4, scale_6, reciprocal_6, amax, ERROR)
        return choose(error_4, error_6, scale_4, code_4, reciprocal_4, scale_6, code_6, reciprocal_6)
