"""Triton helpers of the two E2M1 families (NVFP4, MXFP4): element rounding, random bits, the RHT.

- ``round_e2m1``: E2M1 rounding by the value's bits, RNE or stochastic with a given uniform;
  bit for bit ``models.quant.formats.elements.round_e2m1`` (codes) and its values path.
- stochastic rounding's random bits: one Philox call (``tl.randint4x``: Triton's Philox4x32-10,
  key = the 64-bit seed as (low, high) 32 bits, counter = (offset low, offset high, 0, 0) for a
  64-bit element offset) gives four 32-bit words, the bits of 16 elements, 8 each, as TE's
  ``cvt.rs.satfinite.e2m1x4.f32`` consumes one 32-bit word per four values. Which byte goes to
  which element: ``random_uniforms_16`` (16 elements along a row) and ``quantize_store_4_rows``
  (16 rows down a column). The uniform of a byte is (byte + 1/2) / 256, so P(round up) is the exact
  probability rounded to a multiple of 1/256: E[q] is within 1/512 of a grid step of x.
- ``quantize_store_row`` / ``quantize_store_4_rows``: scale, round and store rows of a group whose
  blocks run down the columns.
- ``rht16``: the 16-point random Hadamard transform of 16 tensors (element j of every tile), the
  butterfly of ``models.quant.rht`` in its order; ``load_16_rows`` / ``max_abs_16`` load and reduce
  the 16 rows of a tile group (blocks down the columns: Wgrad's operands quantized along tokens).
"""

from __future__ import annotations

import torch

from models.quant.kernels.triton_common import tl, triton

KERNEL_INPUT_DTYPES = (torch.bfloat16, torch.float32)
"""What the E2M1 kernels take (an fp16 operand goes through the torch reference)."""

if triton is not None:
    # Imported under its own name: Inductor compiles a kernel called inside torch.compile by splicing
    # the source of every jit helper it calls, defining the helper under its __name__.
    from models.quant.kernels.triton_common import abs_nan_to_inf, round_to_bf16

    @triton.jit
    def rht16(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, ROUND_BF16: tl.constexpr):
        """RHT of 16 tensors (element j of every tile): H16 (s * x) / 4, as models.quant.rht.

        Signs s = [1,1,1,-1,1,-1,-1,-1,-1,-1,-1,1,-1,1,-1,-1]; butterfly strides 8, 4, 2, 1.
        """
        x3 = -x3
        x5 = -x5
        x6 = -x6
        x7 = -x7
        x8 = -x8
        x9 = -x9
        x10 = -x10
        x12 = -x12
        x14 = -x14
        x15 = -x15
        # stride 8
        x0, x8 = x0 + x8, x0 - x8
        x1, x9 = x1 + x9, x1 - x9
        x2, x10 = x2 + x10, x2 - x10
        x3, x11 = x3 + x11, x3 - x11
        x4, x12 = x4 + x12, x4 - x12
        x5, x13 = x5 + x13, x5 - x13
        x6, x14 = x6 + x14, x6 - x14
        x7, x15 = x7 + x15, x7 - x15
        # stride 4
        x0, x4 = x0 + x4, x0 - x4
        x1, x5 = x1 + x5, x1 - x5
        x2, x6 = x2 + x6, x2 - x6
        x3, x7 = x3 + x7, x3 - x7
        x8, x12 = x8 + x12, x8 - x12
        x9, x13 = x9 + x13, x9 - x13
        x10, x14 = x10 + x14, x10 - x14
        x11, x15 = x11 + x15, x11 - x15
        # stride 2
        x0, x2 = x0 + x2, x0 - x2
        x1, x3 = x1 + x3, x1 - x3
        x4, x6 = x4 + x6, x4 - x6
        x5, x7 = x5 + x7, x5 - x7
        x8, x10 = x8 + x10, x8 - x10
        x9, x11 = x9 + x11, x9 - x11
        x12, x14 = x12 + x14, x12 - x14
        x13, x15 = x13 + x15, x13 - x15
        # stride 1
        x0, x1 = x0 + x1, x0 - x1
        x2, x3 = x2 + x3, x2 - x3
        x4, x5 = x4 + x5, x4 - x5
        x6, x7 = x6 + x7, x6 - x7
        x8, x9 = x8 + x9, x8 - x9
        x10, x11 = x10 + x11, x10 - x11
        x12, x13 = x12 + x13, x12 - x13
        x14, x15 = x14 + x15, x14 - x15
        x0 = x0 * 0.25
        x1 = x1 * 0.25
        x2 = x2 * 0.25
        x3 = x3 * 0.25
        x4 = x4 * 0.25
        x5 = x5 * 0.25
        x6 = x6 * 0.25
        x7 = x7 * 0.25
        x8 = x8 * 0.25
        x9 = x9 * 0.25
        x10 = x10 * 0.25
        x11 = x11 * 0.25
        x12 = x12 * 0.25
        x13 = x13 * 0.25
        x14 = x14 * 0.25
        x15 = x15 * 0.25
        if ROUND_BF16 != 0:
            hardware: tl.constexpr = ROUND_BF16 == 2
            x0 = round_to_bf16(x0, hardware)
            x1 = round_to_bf16(x1, hardware)
            x2 = round_to_bf16(x2, hardware)
            x3 = round_to_bf16(x3, hardware)
            x4 = round_to_bf16(x4, hardware)
            x5 = round_to_bf16(x5, hardware)
            x6 = round_to_bf16(x6, hardware)
            x7 = round_to_bf16(x7, hardware)
            x8 = round_to_bf16(x8, hardware)
            x9 = round_to_bf16(x9, hardware)
            x10 = round_to_bf16(x10, hardware)
            x11 = round_to_bf16(x11, hardware)
            x12 = round_to_bf16(x12, hardware)
            x13 = round_to_bf16(x13, hardware)
            x14 = round_to_bf16(x14, hardware)
            x15 = round_to_bf16(x15, hardware)
        return x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15

    @triton.jit
    def round_e2m1(scaled, uniform, STOCHASTIC: tl.constexpr):
        """E2M1 of fp32 scaled (already times r_b): (grid value with sign as fp32, uint8 code).

        By the bits of |scaled| (clamped to 6), not by comparing with the grid: E2M1 values are the
        fp32 values with one mantissa bit and spacing 0.5 below 1, so with e = max(exponent, 0) the
        spacing is 2^(e-1), and
        - RNE: (m + 2^(e+22)) - 2^(e+22), whose fp32 addition rounds m to a multiple of 2^(e-1) with
          ties to even (the even grid neighbour: the tie 0.25 -> 0, 0.75 -> 1, 2.5 -> 2, 5 -> 4);
        - SR: lower = m truncated to one mantissa bit (to a multiple of 0.5 below 1), then
          lower + 2^(e-1) if uniform * 2^(e-1) < m - lower (both sides exact), so
          P(up) = (m - lower) / spacing.
        The kernels are issue-bound, and this compiles to about two thirds of the instructions of a
        comparison ladder (m > 0.25, m >= 0.75, ...).
        A NaN gives 0 and code 0 (its block's NaN scale makes the value NaN)."""
        magnitude = tl.abs(scaled)
        magnitude = tl.where(magnitude > 6.0, 6.0, magnitude)
        bits = magnitude.to(tl.int32, bitcast=True)
        biased_exponent = bits >> 23  # magnitude >= 0: no sign bit; 255 for NaN
        if STOCHASTIC:
            normal = biased_exponent >= 127
            truncated = (bits & -4194304).to(tl.float32, bitcast=True)  # keep one mantissa bit
            lower = tl.where(normal, truncated, (magnitude * 2.0).to(tl.int32).to(tl.float32) * 0.5)
            step = tl.where(normal, ((biased_exponent - 1) << 23).to(tl.float32, bitcast=True), 0.5)
            value = tl.where(uniform * step < magnitude - lower, lower + step, lower)
        else:
            magic = ((tl.maximum(biased_exponent, 127) + 22) << 23).to(tl.float32, bitcast=True)
            value = (magnitude + magic) - magic
        value = tl.where(magnitude == magnitude, value, 0.0)
        value_bits = value.to(tl.int32, bitcast=True)
        value_exponent = value_bits >> 23
        index = tl.where(value_exponent >= 127, ((value_exponent - 126) << 1) | ((value_bits >> 22) & 1),
                         (value * 2.0).to(tl.int32))
        negative = (scaled.to(tl.int32, bitcast=True) < 0) & (scaled == scaled)
        value = tl.where(negative, -value, value)
        code = index | tl.where(negative, 8, 0)
        return value, code.to(tl.uint8)

    @triton.jit
    def load_16_rows(base, cols, mask):
        """Rows 16 g + 0 .. 15 of every 16-row group g: 16 fp32 tensors [GROUPS, BLOCK_C].

        base: pointers to row 16 g (shape [GROUPS, BLOCK_C]); cols: the row stride.
        """
        x0 = tl.load(base + 0 * cols, mask=mask, other=0.0).to(tl.float32)
        x1 = tl.load(base + 1 * cols, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(base + 2 * cols, mask=mask, other=0.0).to(tl.float32)
        x3 = tl.load(base + 3 * cols, mask=mask, other=0.0).to(tl.float32)
        x4 = tl.load(base + 4 * cols, mask=mask, other=0.0).to(tl.float32)
        x5 = tl.load(base + 5 * cols, mask=mask, other=0.0).to(tl.float32)
        x6 = tl.load(base + 6 * cols, mask=mask, other=0.0).to(tl.float32)
        x7 = tl.load(base + 7 * cols, mask=mask, other=0.0).to(tl.float32)
        x8 = tl.load(base + 8 * cols, mask=mask, other=0.0).to(tl.float32)
        x9 = tl.load(base + 9 * cols, mask=mask, other=0.0).to(tl.float32)
        x10 = tl.load(base + 10 * cols, mask=mask, other=0.0).to(tl.float32)
        x11 = tl.load(base + 11 * cols, mask=mask, other=0.0).to(tl.float32)
        x12 = tl.load(base + 12 * cols, mask=mask, other=0.0).to(tl.float32)
        x13 = tl.load(base + 13 * cols, mask=mask, other=0.0).to(tl.float32)
        x14 = tl.load(base + 14 * cols, mask=mask, other=0.0).to(tl.float32)
        x15 = tl.load(base + 15 * cols, mask=mask, other=0.0).to(tl.float32)
        return x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15

    @triton.jit
    def magnitude_of(x, NAN_TO_INF: tl.constexpr):
        """|x|, with NaN -> +Inf if NAN_TO_INF (so a max never drops it)."""
        if NAN_TO_INF:
            magnitude = abs_nan_to_inf(x)
        else:
            magnitude = tl.abs(x)
        return magnitude

    @triton.jit
    def max_abs_16(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, NAN_TO_INF: tl.constexpr):
        """Elementwise max |x_j| over the 16 tensors (NaN -> Inf first if NAN_TO_INF)."""
        block = tl.maximum(magnitude_of(x0, NAN_TO_INF), magnitude_of(x1, NAN_TO_INF))
        block = tl.maximum(block, magnitude_of(x2, NAN_TO_INF))
        block = tl.maximum(block, magnitude_of(x3, NAN_TO_INF))
        block = tl.maximum(block, magnitude_of(x4, NAN_TO_INF))
        block = tl.maximum(block, magnitude_of(x5, NAN_TO_INF))
        block = tl.maximum(block, magnitude_of(x6, NAN_TO_INF))
        block = tl.maximum(block, magnitude_of(x7, NAN_TO_INF))
        block = tl.maximum(block, magnitude_of(x8, NAN_TO_INF))
        block = tl.maximum(block, magnitude_of(x9, NAN_TO_INF))
        block = tl.maximum(block, magnitude_of(x10, NAN_TO_INF))
        block = tl.maximum(block, magnitude_of(x11, NAN_TO_INF))
        block = tl.maximum(block, magnitude_of(x12, NAN_TO_INF))
        block = tl.maximum(block, magnitude_of(x13, NAN_TO_INF))
        block = tl.maximum(block, magnitude_of(x14, NAN_TO_INF))
        block = tl.maximum(block, magnitude_of(x15, NAN_TO_INF))
        return block

    @triton.jit
    def tile_of_program(num_tiles_c, REVERSED: tl.constexpr):
        """(tile row, tile col) of this program in a 1D row-major grid over the tiles. REVERSED walks
        the tiles from the last (NVFP4: its amax pass reads x front to back, so the tail is still in
        L2 when the quantize pass starts there)."""
        pid = tl.program_id(0)
        if REVERSED:
            pid = tl.num_programs(0) - 1 - pid
        return pid // num_tiles_c, pid % num_tiles_c

    @triton.jit
    def uniform_from_byte(byte):
        """(byte + 1/2) / 256 for an integer byte in [0, 256): a uniform with 8 random bits, the
        midpoint of its 1/256 bin (so P(round up) = ceil(256 f - 1/2) / 256, within 1/512 of f)."""
        return (byte.to(tl.float32) + 0.5) * 0.00390625

    @triton.jit
    def random_uniforms_16(seed, offsets):
        """Uniforms [R, NB, 16] for offsets [R, NB], each the offset of the first of 16 consecutive
        elements: one Philox call per offset; element 4 p + b of the 16 takes byte b of word
        (w0, w2, w1, w3)[p] (the order tl.join lays the four words out in)."""
        rows: tl.constexpr = offsets.shape[0]
        blocks: tl.constexpr = offsets.shape[1]
        w0, w1, w2, w3 = tl.randint4x(seed, offsets)
        words = tl.reshape(tl.join(tl.join(w0, w1), tl.join(w2, w3)), [rows, blocks, 4])
        shifts = (8 * tl.arange(0, 4)).to(tl.uint32)
        random_bytes = (words[:, :, :, None] >> shifts[None, None, None, :]) & 255  # [.., word, byte]
        return tl.reshape(uniform_from_byte(random_bytes), [rows, blocks, 16])

    @triton.jit
    def quantize_store_row(
        x, j, uniform, reciprocal, scale, base_offsets, cols, mask, values_ptr, codes_ptr,
        STOCHASTIC: tl.constexpr, WRITE_CODES: tl.constexpr,
    ):
        """Quantize element j of every group of rows ([GROUPS, BLOCK_C]: x * reciprocal rounded to
        E2M1, times scale) and store it at row j of the group (base_offsets: the groups' first rows)."""
        offsets = base_offsets + j * cols
        scaled = x * reciprocal
        if not STOCHASTIC:
            uniform = scaled  # unused by RNE
        value, code = round_e2m1(scaled, uniform, STOCHASTIC)
        tl.store(values_ptr + offsets, (value * scale).to(values_ptr.dtype.element_ty), mask=mask)
        if WRITE_CODES:
            tl.store(codes_ptr + offsets, code, mask=mask)

    @triton.jit
    def uniforms_of_word(word, xa, xb, xc, xd, STOCHASTIC: tl.constexpr):
        """The uniforms of four elements: byte b of the Philox ``word`` for element b with STOCHASTIC;
        otherwise the elements themselves (placeholders round-to-nearest ignores)."""
        if STOCHASTIC:
            ua = uniform_from_byte(word & 255)
            ub = uniform_from_byte((word >> 8) & 255)
            uc = uniform_from_byte((word >> 16) & 255)
            ud = uniform_from_byte(word >> 24)
        else:
            ua = xa
            ub = xb
            uc = xc
            ud = xd
        return ua, ub, uc, ud

    @triton.jit
    def quantize_4(xa, xb, xc, xd, reciprocal, scale, word, STOCHASTIC: tl.constexpr):
        """Four elements of every block quantized, (value * scale, code) each; with STOCHASTIC, element b
        of the four takes byte b of the Philox ``word``."""
        ua, ub, uc, ud = uniforms_of_word(word, xa, xb, xc, xd, STOCHASTIC)
        va, ca = round_e2m1(xa * reciprocal, ua, STOCHASTIC)
        vb, cb = round_e2m1(xb * reciprocal, ub, STOCHASTIC)
        vc, cc = round_e2m1(xc * reciprocal, uc, STOCHASTIC)
        vd, cd = round_e2m1(xd * reciprocal, ud, STOCHASTIC)
        return va * scale, ca, vb * scale, cb, vc * scale, cc, vd * scale, cd

    @triton.jit
    def quantize_store_4_rows(
        xa, xb, xc, xd, j, reciprocal, scale, base_offsets, cols, mask, values_ptr, codes_ptr, word,
        STOCHASTIC: tl.constexpr, WRITE_CODES: tl.constexpr,
    ):
        """Rows j .. j + 3 of every group; with STOCHASTIC, row j + b takes byte b of the Philox ``word``."""
        ua, ub, uc, ud = uniforms_of_word(word, xa, xb, xc, xd, STOCHASTIC)
        quantize_store_row(xa, j, ua, reciprocal, scale, base_offsets, cols, mask, values_ptr, codes_ptr,
                           STOCHASTIC, WRITE_CODES)
        quantize_store_row(xb, j + 1, ub, reciprocal, scale, base_offsets, cols, mask, values_ptr, codes_ptr,
                           STOCHASTIC, WRITE_CODES)
        quantize_store_row(xc, j + 2, uc, reciprocal, scale, base_offsets, cols, mask, values_ptr, codes_ptr,
                           STOCHASTIC, WRITE_CODES)
        quantize_store_row(xd, j + 3, ud, reciprocal, scale, base_offsets, cols, mask, values_ptr, codes_ptr,
                           STOCHASTIC, WRITE_CODES)
