"""The tile bodies of the NVFP4 quantize kernels (``kernels.nvfp4``), as Triton jit functions.

``rows_tile`` (1x16 blocks along the last dim, or 16x16 tiles), ``columns_tile`` (16x1 blocks down dim 0,
optionally after the RHT, Four Over Six or UE5M3 scales) and ``rows_four_over_six_tile`` (Four Over Six along
rows, 1x16 or 16x16) quantize one program's tile: scales, rounding (RNE or stochastic), and either

- WRITE_VALUES: the scaled values q * s_b in x's layout (and, WRITE_CODES, one E2M1 code a byte), what the
  emulated layer reads; or
- codes only: the codes packed two a byte in the GEMM operand's layout, one int64 word per 16-code block
  (``block_word``: code j in bits 4j .. 4j + 3, so the word's little-endian bytes are the block's packed
  codes, element 2i in the low nibble of byte i, torch's ``float4_e2m1fn_x2``): the rows tiles write x's
  [rows, code_cols / 16] words and (16x16, TRANSPOSED_CODES) x^T's [cols, code_rows / 16], the columns tile the
  operand x^T's [cols, code_groups] (its 16 rows of a block are one word, packed along x's rows). The packed
  extents code_rows / code_cols / code_groups may exceed x's, a multiple of 32 codes for torch's GEMM; the
  grid covers them and the elements past x load as zeros, whose codes are zeros (no scale is written for
  them), so the padding is written by the same pass.

Both modes round with the same arithmetic and draws: the codes are the values path's, bit for bit. Each
values kernel of ``kernels.nvfp4`` launches its body with WRITE_VALUES and its extents equal to x's (its launch
signature is what it was); each codes kernel has no values pointer at all.
"""

from __future__ import annotations

from models.quant.kernels.triton_common import tl, triton

if triton is not None:
    # Imported under their own names: Inductor compiles a kernel called inside torch.compile by
    # splicing the source of every jit helper it calls, which defines the helper under its
    # __name__; an alias would leave the kernel calling an undefined name.
    from models.quant.kernels.fp4_common import (
        load_16_rows,
        max_abs_16,
        quantize_4,
        quantize_store_4_rows,
        random_uniforms_16,
        rht16,
        round_e2m1,
        tile_of_program,
    )
    from models.quant.kernels.nvfp4_amax import tensor_scales
    from models.quant.kernels.nvfp4_four_over_six import (
        block_choice,
        block_reciprocal,
        candidate_errors,
        candidate_scales,
        choose,
        join_8,
        load_16_elements,
        store_16_elements,
        tile_sum_of_rows,
    )
    from models.quant.kernels.triton_common import abs_nan_to_inf, e4m3_round, ue5m3_round

    @triton.jit
    def load_global_scales(global_ptr, amax_ptr, first_program, SCALES_FROM_AMAX: tl.constexpr,
                           FOUR_OVER_SIX: tl.constexpr, UE5M3: tl.constexpr):
        """(S_enc, S_dec, amax): from the finalize kernel's output [S_enc, S_dec, -, amax], or
        (SCALES_FROM_AMAX) computed here from the tensor's fp32 amax, the first program writing them to
        global_ptr for the GEMM. Every program computes the same numbers. The amax (which only Four
        Over Six's errors take) is 0 without FOUR_OVER_SIX."""
        if SCALES_FROM_AMAX:
            amax = abs_nan_to_inf(tl.load(amax_ptr).to(tl.float32))
            encode, decode = tensor_scales(amax, FOUR_OVER_SIX, UE5M3)
            if first_program:
                tl.store(global_ptr, encode)
                tl.store(global_ptr + 1, decode)
        else:
            encode = tl.load(global_ptr)
            decode = tl.load(global_ptr + 1)
            if FOUR_OVER_SIX != 0:
                amax = tl.load(global_ptr + 3)
            else:
                amax = tl.zeros([], tl.float32)
        return encode, decode, amax

    @triton.jit
    def block_scale(value, UE5M3: tl.constexpr):
        """The block scale of value >= 0 (or NaN), RNE: E4M3 saturating at 448, or (UE5M3) UE5M3
        saturating at 114688. Returns (fp32 value, uint8 code)."""
        if UE5M3:
            rounded, code = ue5m3_round(value)
        else:
            rounded, code = e4m3_round(value)
        return rounded, code.to(tl.uint8)

    @triton.jit
    def block_word(c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15):
        """The 16 codes of every block (element j of each: [R, B] uint8) as one 64-bit word, code j in bits
        4j .. 4j + 3: in little-endian memory the block's 8 bytes packed two a byte, element 2i in the low
        nibble of byte i (torch's float4_e2m1fn_x2). int64 [R, B], bit for bit."""
        word = c0.to(tl.uint64) | (c1.to(tl.uint64) << 4) | (c2.to(tl.uint64) << 8) | (c3.to(tl.uint64) << 12)
        word = word | (c4.to(tl.uint64) << 16) | (c5.to(tl.uint64) << 20) | (c6.to(tl.uint64) << 24)
        word = word | (c7.to(tl.uint64) << 28) | (c8.to(tl.uint64) << 32) | (c9.to(tl.uint64) << 36)
        word = word | (c10.to(tl.uint64) << 40) | (c11.to(tl.uint64) << 44) | (c12.to(tl.uint64) << 48)
        word = word | (c13.to(tl.uint64) << 52) | (c14.to(tl.uint64) << 56) | (c15.to(tl.uint64) << 60)
        return word.to(tl.int64, bitcast=True)

    @triton.jit
    def words_along(codes, AXIS: tl.constexpr):
        """The 64-bit words (``block_word``'s) of uint8 ``codes`` [16, N] (AXIS 0) or [R, B, 16] (AXIS 2), 16
        codes each: the sum of code k << 4k, whose fields are disjoint, so the sum is their OR."""
        shifts = (4 * tl.arange(0, 16)).to(tl.uint64)
        if AXIS == 0:
            fields = codes.to(tl.uint64) << shifts[:, None]
        else:
            fields = codes.to(tl.uint64) << shifts[None, None, :]
        return tl.sum(fields, axis=AXIS).to(tl.int64, bitcast=True)

    @triton.jit
    def store_transposed_words(words_ptr, codes, pid_r, col, cols, code_rows):
        """x^T's packed codes of one 16-row tile of x (``codes``: [16, N] uint8, x's columns ``col``): word
        (c, pid_r) of the [cols, code_rows / 16] int64 output holds rows 16 pid_r + k of column c."""
        words = words_along(codes, 0)  # [N]
        tl.store(words_ptr + col.to(tl.int64) * (code_rows // 16) + pid_r, words, mask=col < cols)

    @triton.jit
    def rows_tile(
        x_ptr,
        values_ptr,
        codes_ptr,
        transposed_ptr,
        scales_ptr,
        global_ptr,
        amax_ptr,
        seed_ptr,
        rows,
        cols,
        code_rows,
        code_cols,
        BLOCK_R: tl.constexpr,
        BLOCK_C: tl.constexpr,
        TWO_D: tl.constexpr,
        STOCHASTIC: tl.constexpr,
        WRITE_CODES: tl.constexpr,
        WRITE_VALUES: tl.constexpr,
        TRANSPOSED_CODES: tl.constexpr,
        SCALES_FROM_AMAX: tl.constexpr,
        UE5M3: tl.constexpr,
    ):
        """One [BLOCK_R, BLOCK_C] tile: 1x16 blocks along cols, or (TWO_D, BLOCK_R == 16) 16x16 tiles.

        Without WRITE_VALUES the codes are written packed two a byte: x's [rows, code_cols / 2] (WRITE_CODES)
        and, TWO_D, x^T's [cols, code_rows / 2] (TRANSPOSED_CODES). code_rows >= rows and code_cols >= cols
        (multiples of 16) are the packed extents; the grid covers them, and the elements past x load as zeros,
        so their codes are zeros (no scale is written for them)."""
        pid_r, pid_c = tile_of_program(tl.cdiv(code_cols, BLOCK_C), True)
        encode, decode, _ = load_global_scales(global_ptr, amax_ptr, (pid_r == 0) & (pid_c == 0), SCALES_FROM_AMAX, 0,
                                               UE5M3)
        row = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        col = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = (row < rows)[:, None] & (col < cols)[None, :]
        offsets = row.to(tl.int64)[:, None] * cols + col[None, :]
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        x3 = tl.reshape(x, [BLOCK_R, BLOCK_C // 16, 16])
        block_amax = tl.max(tl.abs(x3), axis=2)  # [BLOCK_R, BLOCK_C / 16]
        scale_cols = cols // 16
        scale_col = pid_c * (BLOCK_C // 16) + tl.arange(0, BLOCK_C // 16)
        if TWO_D:
            # Max down the columns first, then over each 16 of them: the same max as over block_amax's
            # axis 0, which Triton 3.6 compiles to a layout holding the whole tile in every thread
            # (255 registers, spilled, 6-7x slower).
            column_amax = tl.max(tl.abs(x), axis=0)  # [BLOCK_C]: rows pid_r*16 .. +16
            tile_amax = tl.max(tl.reshape(column_amax, [BLOCK_C // 16, 16]), axis=1)  # [BLOCK_C / 16]
            tile_scale, tile_code = block_scale(tile_amax * (encode * 0.16666666666666666), UE5M3)
            tl.store(scales_ptr + pid_r * scale_cols + scale_col, tile_code,
                     mask=(scale_col < scale_cols) & (pid_r * 16 < rows))
            scale = tl.broadcast_to(tl.reshape(tile_scale, [1, BLOCK_C // 16]), [BLOCK_R, BLOCK_C // 16])
        else:
            scale, code = block_scale(block_amax * (encode * 0.16666666666666666), UE5M3)
            scale_mask = (row < rows)[:, None] & (scale_col < scale_cols)[None, :]
            scale_offsets = row.to(tl.int64)[:, None] * scale_cols + scale_col[None, :]
            tl.store(scales_ptr + scale_offsets, code, mask=scale_mask)
        reciprocal = block_reciprocal(scale, decode)
        # The scales broadcast by indexing ([:, :, None]), not by tl.reshape(.., [.., 1]), which
        # Triton 3.6 moves through shared memory in the 2D kernel (8% slower there).
        scaled = x3 * reciprocal[:, :, None]
        if STOCHASTIC:
            # One Philox call per 16-element block, counter = the block's first element's offset.
            block_col = pid_c * BLOCK_C + 16 * tl.arange(0, BLOCK_C // 16)
            block_offsets = row.to(tl.int64)[:, None] * cols + block_col[None, :]  # [BLOCK_R, BLOCK_C / 16]
            uniform = random_uniforms_16(tl.load(seed_ptr), block_offsets)
        else:
            uniform = scaled
        value, code_e2m1 = round_e2m1(scaled, uniform, STOCHASTIC)
        if WRITE_VALUES:
            value = value * scale[:, :, None]
            value = tl.reshape(value, [BLOCK_R, BLOCK_C])
            tl.store(values_ptr + offsets, value.to(values_ptr.dtype.element_ty), mask=mask)
            if WRITE_CODES:
                tl.store(codes_ptr + offsets, tl.reshape(code_e2m1, [BLOCK_R, BLOCK_C]), mask=mask)
        else:  # one int64 word per block: codes_ptr [rows, code_cols / 16], transposed_ptr [cols, code_rows / 16]
            if WRITE_CODES:
                words = words_along(code_e2m1, 2)  # [BLOCK_R, BLOCK_C / 16]
                tl.store(codes_ptr + row.to(tl.int64)[:, None] * (code_cols // 16) + scale_col[None, :], words,
                         mask=(row < rows)[:, None] & (scale_col < code_cols // 16)[None, :])
            if TRANSPOSED_CODES:
                store_transposed_words(transposed_ptr, tl.reshape(code_e2m1, [BLOCK_R, BLOCK_C]), pid_r, col, cols,
                                       code_rows)

    @triton.jit
    def columns_tile(
        x_ptr,
        values_ptr,
        codes_ptr,
        scales_ptr,
        global_ptr,
        amax_ptr,
        seed_ptr,
        groups,
        cols,
        code_groups,
        GROUPS: tl.constexpr,
        BLOCK_C: tl.constexpr,
        RHT: tl.constexpr,
        ROUND_BF16: tl.constexpr,  # 0: none (fp32 input), 1: integer RNE, 2: hardware RNE
        STOCHASTIC: tl.constexpr,
        WRITE_CODES: tl.constexpr,
        WRITE_VALUES: tl.constexpr,
        SCALES_FROM_AMAX: tl.constexpr,
        FOUR_OVER_SIX: tl.constexpr,  # 0: off, 1: Four Over Six by MSE, 2: by MAE
        UE5M3: tl.constexpr,  # UE5M3 block scales (not with FOUR_OVER_SIX)
    ):
        """GROUPS groups of 16 rows x BLOCK_C cols; blocks are 16x1 (down the columns).

        Without WRITE_VALUES (WRITE_CODES then) the codes are written packed two a byte in the operand's layout,
        x^T [cols, 8 code_groups]: byte (c, 8 g + i) holds rows 16 g + 2i (low nibble) and 16 g + 2i + 1 of
        column c. code_groups >= groups; the grid covers them, and the groups past x load as zeros, so their
        codes are zeros (no scale is written for them)."""
        pid_g, pid_c = tile_of_program(tl.cdiv(cols, BLOCK_C), True)
        encode, decode, amax = load_global_scales(global_ptr, amax_ptr, (pid_g == 0) & (pid_c == 0),
                                                  SCALES_FROM_AMAX, FOUR_OVER_SIX, UE5M3)
        group = pid_g * GROUPS + tl.arange(0, GROUPS)
        col = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = (group < groups)[:, None] & (col < cols)[None, :]
        base_offsets = (group.to(tl.int64) * 16)[:, None] * cols + col[None, :]
        base = x_ptr + base_offsets
        x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15 = load_16_rows(base, cols, mask)
        if RHT:
            x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15 = rht16(
                x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, ROUND_BF16
            )
        block_amax = max_abs_16(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, NAN_TO_INF=False)
        if FOUR_OVER_SIX != 0:
            scale, scale_code, reciprocal = block_choice(
                x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
                block_amax, encode, decode, amax, FOUR_OVER_SIX)
        else:
            scale, scale_code = block_scale(block_amax * (encode * 0.16666666666666666), UE5M3)
            reciprocal = block_reciprocal(scale, decode)
        scale_offsets = group.to(tl.int64)[:, None] * cols + col[None, :]
        tl.store(scales_ptr + scale_offsets, scale_code.to(tl.uint8), mask=mask)
        if STOCHASTIC:
            # One Philox call per 16x1 block (counter = its first element's offset): row 4 w + b of
            # the block takes byte b of word w.
            w0, w1, w2, w3 = tl.randint4x(tl.load(seed_ptr), base_offsets)
        else:
            w0 = 0
            w1 = 0
            w2 = 0
            w3 = 0
        if WRITE_VALUES:
            quantize_store_4_rows(x0, x1, x2, x3, 0, reciprocal, scale, base_offsets, cols, mask,
                                  values_ptr, codes_ptr, w0, STOCHASTIC, WRITE_CODES)
            quantize_store_4_rows(x4, x5, x6, x7, 4, reciprocal, scale, base_offsets, cols, mask,
                                  values_ptr, codes_ptr, w1, STOCHASTIC, WRITE_CODES)
            quantize_store_4_rows(x8, x9, x10, x11, 8, reciprocal, scale, base_offsets, cols, mask,
                                  values_ptr, codes_ptr, w2, STOCHASTIC, WRITE_CODES)
            quantize_store_4_rows(x12, x13, x14, x15, 12, reciprocal, scale, base_offsets, cols, mask,
                                  values_ptr, codes_ptr, w3, STOCHASTIC, WRITE_CODES)
        else:
            # The same rounding as quantize_store_4_rows (x * r_b, row 4 w + b on byte b of word w); the
            # values quantize_4 also returns are never stored.
            _, c0, _, c1, _, c2, _, c3 = quantize_4(x0, x1, x2, x3, reciprocal, scale, w0, STOCHASTIC)
            _, c4, _, c5, _, c6, _, c7 = quantize_4(x4, x5, x6, x7, reciprocal, scale, w1, STOCHASTIC)
            _, c8, _, c9, _, c10, _, c11 = quantize_4(x8, x9, x10, x11, reciprocal, scale, w2, STOCHASTIC)
            _, c12, _, c13, _, c14, _, c15 = quantize_4(x12, x13, x14, x15, reciprocal, scale, w3, STOCHASTIC)
            words = block_word(c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15)
            # codes_ptr: int64 [cols, code_groups], one word per 16x1 block
            tl.store(codes_ptr + col.to(tl.int64)[None, :] * code_groups + group[:, None], words,
                     mask=(group < code_groups)[:, None] & (col < cols)[None, :])

    @triton.jit
    def rows_four_over_six_tile(
        x_ptr,
        values_ptr,
        codes_ptr,
        transposed_ptr,
        scales_ptr,
        global_ptr,
        amax_ptr,
        seed_ptr,
        rows,
        cols,
        code_rows,
        code_cols,
        BLOCK_R: tl.constexpr,
        BLOCKS: tl.constexpr,
        TWO_D: tl.constexpr,
        STOCHASTIC: tl.constexpr,
        WRITE_CODES: tl.constexpr,
        WRITE_VALUES: tl.constexpr,
        TRANSPOSED_CODES: tl.constexpr,
        FOUR_OVER_SIX: tl.constexpr,  # 1: by MSE, 2: by MAE
        IN_PIECE: tl.constexpr,  # elements per 16-byte load: 8 (bf16 x) or 4 (fp32)
        OUT_PIECE: tl.constexpr,  # elements per 16-byte store of the values
    ):
        """Four Over Six on BLOCK_R rows x BLOCKS 16-element blocks along cols, or (TWO_D, BLOCK_R == 16)
        BLOCKS 16x16 tiles. Each thread loads and stores whole blocks in 16-byte pieces, split in its
        registers into element j of every block, the tensor x_j [BLOCK_R, BLOCKS] (``nvfp4_four_over_six``); stochastic rounding draws
        the rows kernel's bits (element 4 p + b of a block: byte b of Philox word (w0, w2, w1, w3)[p] at
        the block's first offset). Packed codes without WRITE_VALUES, code_rows and code_cols: as in
        ``_quantize_rows_kernel``."""
        scale_cols = cols // 16
        pid_r, pid_c = tile_of_program(tl.cdiv(code_cols // 16, BLOCKS), True)
        encode, decode, amax = load_global_scales(global_ptr, amax_ptr, (pid_r == 0) & (pid_c == 0), True,
                                                  FOUR_OVER_SIX, False)
        row = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        block = pid_c * BLOCKS + tl.arange(0, BLOCKS)
        mask = (row < rows)[:, None] & (block < scale_cols)[None, :]
        base_offsets = row.to(tl.int64)[:, None] * cols + (block * 16)[None, :]
        x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15 = load_16_elements(
            x_ptr + base_offsets, mask, IN_PIECE)
        block_amax = max_abs_16(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, NAN_TO_INF=False)
        if TWO_D:
            scale_4, code_4, reciprocal_4, scale_6, code_6, reciprocal_6 = candidate_scales(
                tl.max(block_amax, axis=0), encode, decode)  # [BLOCKS]: one pair per 16x16 tile
            row_errors_4, row_errors_6 = candidate_errors(
                x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
                scale_4[None, :], reciprocal_4[None, :], scale_6[None, :], reciprocal_6[None, :], amax, FOUR_OVER_SIX)
            error_4 = tile_sum_of_rows(row_errors_4)
            error_6 = tile_sum_of_rows(row_errors_6)
            scale, code, reciprocal = choose(error_4, error_6, scale_4, code_4, reciprocal_4, scale_6, code_6,
                                             reciprocal_6)
            tl.store(scales_ptr + pid_r * scale_cols + block, code.to(tl.uint8),
                     mask=(block < scale_cols) & (pid_r * 16 < rows))
            scale = tl.broadcast_to(scale[None, :], [BLOCK_R, BLOCKS])
            reciprocal = tl.broadcast_to(reciprocal[None, :], [BLOCK_R, BLOCKS])
        else:
            scale, code, reciprocal = block_choice(
                x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
                block_amax, encode, decode, amax, FOUR_OVER_SIX)
            tl.store(scales_ptr + row.to(tl.int64)[:, None] * scale_cols + block[None, :], code.to(tl.uint8),
                     mask=mask)
        if STOCHASTIC:
            w0, w1, w2, w3 = tl.randint4x(tl.load(seed_ptr), base_offsets)
        else:
            w0 = 0
            w1 = 0
            w2 = 0
            w3 = 0
        v0, c0, v1, c1, v2, c2, v3, c3 = quantize_4(x0, x1, x2, x3, reciprocal, scale, w0, STOCHASTIC)
        v4, c4, v5, c5, v6, c6, v7, c7 = quantize_4(x4, x5, x6, x7, reciprocal, scale, w2, STOCHASTIC)
        v8, c8, v9, c9, v10, c10, v11, c11 = quantize_4(x8, x9, x10, x11, reciprocal, scale, w1, STOCHASTIC)
        v12, c12, v13, c13, v14, c14, v15, c15 = quantize_4(x12, x13, x14, x15, reciprocal, scale, w3, STOCHASTIC)
        if WRITE_VALUES:
            store_16_elements(values_ptr + base_offsets, mask,
                              v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15, OUT_PIECE)
            if WRITE_CODES:
                store_16_elements(codes_ptr + base_offsets, mask,
                                  c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, 8)
        else:  # one int64 word per block: codes_ptr [rows, code_cols / 16], transposed_ptr [cols, code_rows / 16]
            if WRITE_CODES:  # each block's word from the thread that holds the block
                words = block_word(c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15)
                tl.store(codes_ptr + row.to(tl.int64)[:, None] * (code_cols // 16) + block[None, :], words,
                         mask=(row < rows)[:, None] & (block < code_cols // 16)[None, :])
            if TRANSPOSED_CODES:  # element j of every block is column 16 b + j of the 16-row tile
                # one [16, BLOCKS * 16] tile, one reduction down its rows (16 of [16, BLOCKS] spill registers)
                tile = tl.permute(tl.join(join_8(c0, c1, c2, c3, c4, c5, c6, c7),
                                          join_8(c8, c9, c10, c11, c12, c13, c14, c15)), (0, 1, 3, 2))
                store_transposed_words(transposed_ptr, tl.reshape(tile, [BLOCK_R, BLOCKS * 16]), pid_r,
                                       pid_c * BLOCKS * 16 + tl.arange(0, BLOCKS * 16), cols, code_rows)
