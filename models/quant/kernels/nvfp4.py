"""Triton kernels for NVFP4 quantize-dequantize: the emulated GEMM operands, fused.

Each kernel's torch reference is defined next to it (``quantize_rows_ref``, ``quantize_columns_ref``:
``models.quant.formats.quantize(..., "nvfp4")``, TE's fp32 op order, after ``models.quant.rht.rht``
for the RHT variant). Bit-identical to it for round-to-nearest (element codes, E4M3 block scales,
scaled values q * s_b, per-tensor decode scale); stochastic rounding draws its bits with Triton's
Philox (``fp4_common``) instead of torch's generator, so it matches in distribution, not in draws.

Orientations (x is a contiguous 2D [rows, cols] CUDA tensor, bf16 or fp32):
- ``quantize_rows(x)``: 1x16 blocks along the last dim (X for Fprop, dY for Dgrad).
- ``quantize_rows(x, two_d=True)``: one scale per 16x16 tile (W).
- ``quantize_columns(x, rht=...)``: 16x1 blocks along dim 0, i.e. ``quantize(rht(x.t()))`` for
  Wgrad's operands quantized along tokens, written back in x's own [rows, cols] layout (scales
  [rows / 16, cols]) so that no transpose is materialized.

Launches: the amax pass (``nvfp4_amax``), then the quantize pass, which walks its tiles from the
last, so that it starts on what the amax pass left in L2. Per tile: block amax, E4M3 scale,
reciprocal, scaling, E2M1 rounding (RNE or stochastic, by the bits of the value: ``round_e2m1``),
outputs. E4M3 rounding of the block scale is done arithmetically (``e4m3_round``); the RHT output
is rounded to bf16 as ``tensor.to(bfloat16)`` does. NaN/Inf anywhere turns the tensor amax into
Inf, and a non-finite amax gives a NaN decode scale, as in the reference. Literals inside the
kernels: 0.16666666666666666 = 1/6 (becomes fp32(1/6), TE's constexpr 1.0f / 6.0f),
3.4028234663852886e38 = FLT_MAX.

UE5M3 block scales (``fmt="nvfp4_ue5m3"``, the element format ``nvfp4_ue5m3``; torch reference: the same
``quantize`` with that format): the rows and columns kernels under their UE5M3 constexpr round each block
scale with ``ue5m3_round`` instead of ``e4m3_round`` and take S_enc = 688128 / amax; the block scales
come out as uint8 UE5M3 codes. Everything else (RHT, stochastic rounding, 2D) is unchanged.

Four Over Six (``four_over_six="mse"`` or ``"mae"``, from ``OperandSpec.four_over_six``; the torch
reference is ``formats.four_over_six``): the amax passes and the in-kernel scales take S_enc = 1536 / amax,
and each block is quantized with both candidate scales, keeping the lower-error one
(``nvfp4_four_over_six``). The columns kernel does it under its FOUR_OVER_SIX constexpr (its 16 rows
already are 16 tensors); along rows a kernel of its own (``_quantize_rows_four_over_six_kernel``)
splits each thread's whole blocks into element j of every block, one tensor each, so a candidate's
error is summed in TE's element order.
Stochastic rounding keeps the round-to-nearest choice and draws the same bits as without it.

``quantize_operand`` and friends (end of module) are what ``models.quant.linear`` calls for an
operand whose format names this module (``FormatSpec.quantize_kernel``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch

from models.quant.formats import QuantizedTensor, quantize
from models.quant.formats.elements import ue5m3_codes
from models.quant.formats.nvfp4 import SCALE_BOUNDS
from models.quant.kernels.fp4_common import KERNEL_INPUT_DTYPES
from models.quant.kernels.nvfp4_amax import (global_scales_from_amax, rht_global_scales, rows_and_rht_columns_scales,
                                              tensor_amax, ue5m3_scales)
from models.quant.kernels.nvfp4_four_over_six import four_over_six_code
from models.quant.kernels.options import NVFP4_OPTIONS, Nvfp4Options
from models.quant.kernels.triton_common import (
    bf16_rounding_mode,
    check_input,
    enabled,
    seed_tensor,
    tl,
    triton,
)
from models.quant.rht import rht as random_hadamard_transform


def quantize_rows_ref(x: torch.Tensor, *, two_d: bool = False, four_over_six: Optional[str] = None,
                      fmt: str = "nvfp4", **rounding) -> QuantizedTensor:
    """The torch reference of ``quantize_rows`` (round to nearest; ``rounding``: quantize()'s rounding
    and uniform, for stochastic rounding with the kernel's draws)."""
    return quantize(x, fmt, tile=(16, 16) if two_d else (1, 16), four_over_six=four_over_six, **rounding)


def quantize_columns_ref(x: torch.Tensor, *, rht: bool = False, four_over_six: Optional[str] = None,
                         fmt: str = "nvfp4", **rounding) -> QuantizedTensor:
    """The torch reference of ``quantize_columns`` (round to nearest), in the operand's [cols, rows]
    layout: the kernel's outputs transposed."""
    return quantize(random_hadamard_transform(x.t()) if rht else x.t(), fmt, four_over_six=four_over_six,
                    **rounding)


def block_scale_codes(reference: QuantizedTensor) -> torch.Tensor:
    """A reference's block scales as the uint8 codes the kernels write (E4M3 bits, or UE5M3 codes)."""
    scales = reference.block_scales
    return scales.view(torch.uint8) if scales.dtype == torch.float8_e4m3fn else ue5m3_codes(scales)


@dataclass
class KernelQuantized:
    """Output of a kernel, in the input's [rows, cols] layout.

    values: q * s_b (scaled values, without the per-tensor decode scale), ``out_dtype``.
    block_scales: float8_e4m3fn (uint8 UE5M3 codes for nvfp4_ue5m3); rows: [rows, cols/16];
        two_d: [rows/16, cols/16]; columns: [rows/16, cols].
    decode_scale: fp32 [1], 1/S_enc (NaN if the input had NaN/Inf).
    codes: uint8 E2M1 codes [rows, cols] (bit 3 sign), or None when not asked for.
    """

    values: torch.Tensor
    block_scales: torch.Tensor
    decode_scale: torch.Tensor
    codes: Optional[torch.Tensor]


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
        load_16_elements,
        store_16_elements,
        tile_sum_of_rows,
    )
    from models.quant.kernels.triton_common import abs_nan_to_inf, e4m3_round, ue5m3_round

    @triton.jit
    def _load_global_scales(global_ptr, amax_ptr, first_program, SCALES_FROM_AMAX: tl.constexpr,
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
    def _block_scale(value, UE5M3: tl.constexpr):
        """The block scale of value >= 0 (or NaN), RNE: E4M3 saturating at 448, or (UE5M3) UE5M3
        saturating at 114688. Returns (fp32 value, uint8 code)."""
        if UE5M3:
            rounded, code = ue5m3_round(value)
        else:
            rounded, code = e4m3_round(value)
        return rounded, code.to(tl.uint8)

    @triton.jit
    def _quantize_rows_kernel(
        x_ptr,
        values_ptr,
        codes_ptr,
        scales_ptr,
        global_ptr,
        amax_ptr,
        seed_ptr,
        rows,
        cols,
        BLOCK_R: tl.constexpr,
        BLOCK_C: tl.constexpr,
        TWO_D: tl.constexpr,
        STOCHASTIC: tl.constexpr,
        WRITE_CODES: tl.constexpr,
        SCALES_FROM_AMAX: tl.constexpr,
        UE5M3: tl.constexpr,
    ):
        """One [BLOCK_R, BLOCK_C] tile: 1x16 blocks along cols, or (TWO_D, BLOCK_R == 16) 16x16 tiles."""
        pid_r, pid_c = tile_of_program(tl.cdiv(cols, BLOCK_C), True)
        encode, decode, _ = _load_global_scales(global_ptr, amax_ptr, (pid_r == 0) & (pid_c == 0), SCALES_FROM_AMAX, 0,
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
            tile_scale, tile_code = _block_scale(tile_amax * (encode * 0.16666666666666666), UE5M3)
            tl.store(scales_ptr + pid_r * scale_cols + scale_col, tile_code, mask=scale_col < scale_cols)
            scale = tl.broadcast_to(tl.reshape(tile_scale, [1, BLOCK_C // 16]), [BLOCK_R, BLOCK_C // 16])
        else:
            scale, code = _block_scale(block_amax * (encode * 0.16666666666666666), UE5M3)
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
        value = value * scale[:, :, None]
        value = tl.reshape(value, [BLOCK_R, BLOCK_C])
        tl.store(values_ptr + offsets, value.to(values_ptr.dtype.element_ty), mask=mask)
        if WRITE_CODES:
            tl.store(codes_ptr + offsets, tl.reshape(code_e2m1, [BLOCK_R, BLOCK_C]), mask=mask)

    @triton.jit
    def _quantize_columns_kernel(
        x_ptr,
        values_ptr,
        codes_ptr,
        scales_ptr,
        global_ptr,
        amax_ptr,
        seed_ptr,
        groups,
        cols,
        GROUPS: tl.constexpr,
        BLOCK_C: tl.constexpr,
        RHT: tl.constexpr,
        ROUND_BF16: tl.constexpr,  # 0: none (fp32 input), 1: integer RNE, 2: hardware RNE
        STOCHASTIC: tl.constexpr,
        WRITE_CODES: tl.constexpr,
        SCALES_FROM_AMAX: tl.constexpr,
        FOUR_OVER_SIX: tl.constexpr,  # 0: off, 1: Four Over Six by MSE, 2: by MAE
        UE5M3: tl.constexpr,  # UE5M3 block scales (not with FOUR_OVER_SIX)
    ):
        """GROUPS groups of 16 rows x BLOCK_C cols; blocks are 16x1 (down the columns)."""
        pid_g, pid_c = tile_of_program(tl.cdiv(cols, BLOCK_C), True)
        encode, decode, amax = _load_global_scales(global_ptr, amax_ptr, (pid_g == 0) & (pid_c == 0),
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
            scale, scale_code = _block_scale(block_amax * (encode * 0.16666666666666666), UE5M3)
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
        quantize_store_4_rows(x0, x1, x2, x3, 0, reciprocal, scale, base_offsets, cols, mask,
                              values_ptr, codes_ptr, w0, STOCHASTIC, WRITE_CODES)
        quantize_store_4_rows(x4, x5, x6, x7, 4, reciprocal, scale, base_offsets, cols, mask,
                              values_ptr, codes_ptr, w1, STOCHASTIC, WRITE_CODES)
        quantize_store_4_rows(x8, x9, x10, x11, 8, reciprocal, scale, base_offsets, cols, mask,
                              values_ptr, codes_ptr, w2, STOCHASTIC, WRITE_CODES)
        quantize_store_4_rows(x12, x13, x14, x15, 12, reciprocal, scale, base_offsets, cols, mask,
                              values_ptr, codes_ptr, w3, STOCHASTIC, WRITE_CODES)


    @triton.jit
    def _quantize_rows_four_over_six_kernel(
        x_ptr,
        values_ptr,
        codes_ptr,
        scales_ptr,
        global_ptr,
        amax_ptr,
        seed_ptr,
        rows,
        cols,
        BLOCK_R: tl.constexpr,
        BLOCKS: tl.constexpr,
        TWO_D: tl.constexpr,
        STOCHASTIC: tl.constexpr,
        WRITE_CODES: tl.constexpr,
        FOUR_OVER_SIX: tl.constexpr,  # 1: by MSE, 2: by MAE
        IN_PIECE: tl.constexpr,  # elements per 16-byte load: 8 (bf16 x) or 4 (fp32)
        OUT_PIECE: tl.constexpr,  # elements per 16-byte store of the values
    ):
        """Four Over Six on BLOCK_R rows x BLOCKS 16-element blocks along cols, or (TWO_D, BLOCK_R == 16)
        BLOCKS 16x16 tiles. Each thread loads and stores whole blocks in 16-byte pieces, split in its
        registers into element j of every block, the tensor x_j [BLOCK_R, BLOCKS] (``nvfp4_four_over_six``); stochastic rounding draws
        the rows kernel's bits (element 4 p + b of a block: byte b of Philox word (w0, w2, w1, w3)[p] at
        the block's first offset)."""
        scale_cols = cols // 16
        pid_r, pid_c = tile_of_program(tl.cdiv(scale_cols, BLOCKS), True)
        encode, decode, amax = _load_global_scales(global_ptr, amax_ptr, (pid_r == 0) & (pid_c == 0), True,
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
            tl.store(scales_ptr + pid_r * scale_cols + block, code.to(tl.uint8), mask=block < scale_cols)
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
        store_16_elements(values_ptr + base_offsets, mask,
                          v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15, OUT_PIECE)
        if WRITE_CODES:
            store_16_elements(codes_ptr + base_offsets, mask,
                              c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, 8)


def _check(x: torch.Tensor, rows_multiple: int, what: str, name: Optional[str]) -> None:
    check_input(x, dtypes=KERNEL_INPUT_DTYPES, cols_multiple=16, rows_multiple=rows_multiple, what=what, name=name)


def _check_variant(fmt: str, four_over_six: Optional[str]) -> bool:
    """The UE5M3 constexpr of (fmt, four_over_six); ValueError for an unknown format or Four Over Six with
    UE5M3 scales (a combination the torch reference does not define either)."""
    ue5m3 = ue5m3_scales(fmt)
    if ue5m3 and four_over_six is not None:
        raise ValueError(f"Four Over Six takes E4M3 block scales (nvfp4), not {fmt}")
    return ue5m3


def _global_scales_or_amax(x: torch.Tensor, *, rht: bool, given: Optional[torch.Tensor], options: Nvfp4Options,
                           four_over_six: bool = False, fmt: str = "nvfp4"):
    """(global_scales [2] fp32, amax) for a quantize kernel. Without RHT there is no finalize launch:
    ``amax`` is max |x| (``tensor_amax``, or ``given``) and the kernel derives [S_enc, S_dec]
    itself, writing them into the (uninitialized) ``global_scales``; with RHT ``global_scales`` is
    rht_global_scales' output (or ``given``) and ``amax`` is that same tensor (a placeholder the
    kernel ignores). ``four_over_six``, ``fmt``: the RHT scales from Four Over Six's or ``fmt``'s bound
    (given ones must be)."""
    if given is not None and (given.dtype != torch.float32 or given.device != x.device
                              or given.numel() < (4 if rht else 1)):
        raise ValueError(f"precomputed {'global scales' if rht else 'amax'} must be fp32 on {x.device} with "
                         f"at least {4 if rht else 1} elements, got {given.dtype} {list(given.shape)} on {given.device}")
    if rht:
        global_scales = (rht_global_scales(x, four_over_six=four_over_six, fmt=fmt, options=options)
                         if given is None else given)
        return global_scales, global_scales
    amax = tensor_amax(x, options=options) if given is None else given
    return torch.empty(2, dtype=torch.float32, device=x.device), amax


def _outputs(x, scales_shape, out_dtype, write_codes, ue5m3):
    values = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    codes = torch.empty(x.shape, dtype=torch.uint8, device=x.device) if write_codes else values
    scales = torch.empty(scales_shape, dtype=torch.uint8 if ue5m3 else torch.float8_e4m3fn, device=x.device)
    return values, codes, scales


def quantize_rows(
    x: torch.Tensor,
    *,
    two_d: bool = False,
    stochastic: bool = False,
    seed=None,
    generator: Optional[torch.Generator] = None,
    out_dtype: torch.dtype = torch.bfloat16,
    write_codes: bool = False,
    amax: Optional[torch.Tensor] = None,
    name: Optional[str] = None,
    four_over_six: Optional[str] = None,
    fmt: str = "nvfp4",
    options: Nvfp4Options = NVFP4_OPTIONS,
) -> KernelQuantized:
    """NVFP4 of a [rows, cols] CUDA tensor with 1x16 blocks along cols (or 16x16 tiles if two_d).

    Equals ``quantize_rows_ref(x, two_d=two_d, four_over_six=four_over_six, fmt=fmt)`` for RNE. ``seed`` (int or
    1-element tensor) or ``generator`` seeds stochastic rounding; by default a seed is drawn from
    torch's global RNG on x's device (no host sync). ``amax``: max |x| already taken (fp32, its first
    element; element 2 of ``rows_and_rht_columns_scales``), which skips the amax pass.
    ``four_over_six``: None, or Four Over Six with this candidate error ("mse", "mae"). ``fmt``: nvfp4,
    or nvfp4_ue5m3 for UE5M3 block scales.
    """
    _check(x, 16 if two_d else 1, "nvfp4 quantize_rows", name)
    ue5m3 = _check_variant(fmt, four_over_six)
    x = x.contiguous()
    rows, cols = x.shape
    global_scales, amax = _global_scales_or_amax(x, rht=False, given=amax, options=options)
    scales_shape = (rows // 16, cols // 16) if two_d else (rows, cols // 16)
    values, codes, scales = _outputs(x, scales_shape, out_dtype, write_codes, ue5m3)
    seed = seed_tensor(x, seed, generator) if stochastic else global_scales
    if four_over_six is not None:
        block_r, block_c, warps = options.two_d_four_over_six if two_d else options.rows_four_over_six
        grid = (triton.cdiv(rows, block_r) * triton.cdiv(cols // 16, block_c // 16),)
        _quantize_rows_four_over_six_kernel[grid](
            x, values, codes, scales.view(torch.uint8), global_scales, amax, seed, rows, cols,
            BLOCK_R=block_r, BLOCKS=block_c // 16, TWO_D=two_d, STOCHASTIC=stochastic, WRITE_CODES=write_codes,
            FOUR_OVER_SIX=four_over_six_code(four_over_six), IN_PIECE=16 // x.element_size(),
            OUT_PIECE=16 // values.element_size(), num_warps=warps, enable_fp_fusion=False,
        )
        return KernelQuantized(values, scales, global_scales[1:2], codes if write_codes else None)
    block_r, block_c, warps = options.two_d if two_d else options.rows_launch(cols)
    grid = (triton.cdiv(rows, block_r) * triton.cdiv(cols, block_c),)
    _quantize_rows_kernel[grid](
        x, values, codes, scales.view(torch.uint8), global_scales, amax, seed, rows, cols,
        BLOCK_R=block_r, BLOCK_C=block_c, TWO_D=two_d, STOCHASTIC=stochastic, WRITE_CODES=write_codes,
        SCALES_FROM_AMAX=True, UE5M3=ue5m3, num_warps=warps, enable_fp_fusion=False,
    )
    return KernelQuantized(values, scales, global_scales[1:2], codes if write_codes else None)


def quantize_columns(
    x: torch.Tensor,
    *,
    rht: bool = False,
    stochastic: bool = False,
    seed=None,
    generator: Optional[torch.Generator] = None,
    out_dtype: torch.dtype = torch.bfloat16,
    write_codes: bool = False,
    global_scales: Optional[torch.Tensor] = None,
    name: Optional[str] = None,
    four_over_six: Optional[str] = None,
    fmt: str = "nvfp4",
    options: Nvfp4Options = NVFP4_OPTIONS,
) -> KernelQuantized:
    """NVFP4 of x [rows, cols] with 16x1 blocks along rows (dim 0), optionally after the RHT along rows.

    Equals ``quantize_columns_ref(x, rht=rht, four_over_six=four_over_six, fmt=fmt)`` transposed back
    (RNE): outputs are in x's layout, scales [rows / 16, cols]. ``global_scales`` (RHT only): [S_enc,
    S_dec, -, amax] already taken (``rows_and_rht_columns_scales``, with the same ``four_over_six`` and
    ``fmt``), which skips the amax pass; the returned decode scale is then a view of it.
    """
    if global_scales is not None and not rht:
        raise ValueError("nvfp4 quantize_columns takes precomputed global_scales with rht=True only")
    _check(x, 16, "nvfp4 quantize_columns", name)
    ue5m3 = _check_variant(fmt, four_over_six)
    x = x.contiguous()
    rows, cols = x.shape
    groups_per_program, block_c, warps = options.columns_stochastic if stochastic else options.columns
    global_scales, amax = _global_scales_or_amax(x, rht=rht, given=global_scales, options=options,
                                                 four_over_six=four_over_six is not None, fmt=fmt)
    values, codes, scales = _outputs(x, (rows // 16, cols), out_dtype, write_codes, ue5m3)
    seed = seed_tensor(x, seed, generator) if stochastic else global_scales
    grid = (triton.cdiv(rows // 16, groups_per_program) * triton.cdiv(cols, block_c),)
    _quantize_columns_kernel[grid](
        x, values, codes, scales.view(torch.uint8), global_scales, amax, seed, rows // 16, cols,
        GROUPS=groups_per_program, BLOCK_C=block_c, RHT=rht, ROUND_BF16=bf16_rounding_mode(x, options.bf16_rounding),
        STOCHASTIC=stochastic, WRITE_CODES=write_codes, SCALES_FROM_AMAX=amax is not global_scales,
        FOUR_OVER_SIX=four_over_six_code(four_over_six), UE5M3=ue5m3, num_warps=warps, enable_fp_fusion=False,
    )
    return KernelQuantized(values, scales, global_scales[1:2], codes if write_codes else None)


# ----------------------------------------------------------------------------------------------
# The operand interface of models.quant.linear (FormatSpec.quantize_kernel == "nvfp4"). ``spec`` is
# an OperandSpec (fmt, tile, rounding, rht); the operand is ``tensor.t() if transpose else tensor``.


def operand_supported(tensor: torch.Tensor, spec, transpose: bool) -> bool:
    """Whether the kernels quantize this operand (else the layer runs the torch reference)."""
    if not (enabled() and spec.fmt in SCALE_BOUNDS and tensor.is_cuda and tensor.dtype in KERNEL_INPUT_DTYPES
            and tensor.ndim == 2):
        return False
    if spec.rht and not transpose:  # the kernels apply the RHT along dim 0 only (Wgrad's case)
        return False
    return not (transpose and spec.tile == (1, 16) and tensor.shape[0] % 16 != 0)


def shared_scales(tensor: torch.Tensor, rows_spec, columns_spec) -> Optional[torch.Tensor]:
    """[S_enc, S_dec, max |tensor|] from one read when ``tensor`` is quantized by the kernels both
    along rows (1x16, ``rows_spec``: Fprop X, Dgrad dY) and along columns with the RHT
    (``columns_spec``: Wgrad X^T, dY^T), else None. The two ``quantize_operand`` calls then skip
    their amax passes: three reads of the tensor for its two orientations instead of four, and the
    same outputs (``rows_and_rht_columns_scales``)."""
    if rows_spec is None or columns_spec is None or rows_spec.tile != (1, 16) or columns_spec.tile != (1, 16):
        return None
    if rows_spec.fmt != columns_spec.fmt:
        return None
    if rows_spec.rht or not columns_spec.rht:
        return None
    if not (operand_supported(tensor, rows_spec, False) and operand_supported(tensor, columns_spec, True)):
        return None
    return rows_and_rht_columns_scales(tensor, four_over_six=columns_spec.four_over_six is not None,
                                       fmt=columns_spec.fmt)


def group_scales(tensor: torch.Tensor, spec, transpose: bool,
                 reduce_amax: Callable[[torch.Tensor], torch.Tensor]) -> Optional[torch.Tensor]:
    """The ``scales`` argument of ``quantize_operand`` for a tensor-parallel shard whose per-tensor scale is
    the group's: this shard's amax from the kernels' own pass (of the RHT'd values for Wgrad's columns), made
    the group's by ``reduce_amax`` (fp32 [1] -> the max over the group, ``quantized_linear.all_reduce_amax``),
    so the shard quantizes as its slice of the whole tensor does. None where the kernels take no given scales
    (columns without the RHT): the torch reference then. The operand must be one ``operand_supported`` takes."""
    four_over_six = spec.four_over_six is not None
    if transpose and spec.tile == (1, 16):
        if not spec.rht:
            return None
        local = rht_global_scales(tensor, four_over_six=four_over_six, fmt=spec.fmt)[3:4]
        return global_scales_from_amax(reduce_amax(local), four_over_six=four_over_six, fmt=spec.fmt)
    amax = reduce_amax(tensor_amax(tensor.contiguous()))  # rows, or a 16x16 tiling of the tensor itself
    return torch.cat([amax.new_zeros(2), amax, amax])  # quantize_operand passes element 2 on as the amax


def quantize_operand(tensor: torch.Tensor, spec, *, transpose: bool, seed: Optional[torch.Tensor],
                     generator: Optional[torch.Generator], out_dtype: torch.dtype, scales: Optional[torch.Tensor],
                     name: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """(q * s_b [operand rows, reduction] in ``out_dtype``, 0-dim per-tensor decode scale) of the
    operand. ``scales``: ``shared_scales``' output for this tensor, or None."""
    stochastic = spec.rounding == "stochastic"
    if transpose and spec.tile == (1, 16):
        out = quantize_columns(tensor, rht=spec.rht, stochastic=stochastic, seed=seed, generator=generator,
                               out_dtype=out_dtype, global_scales=scales, name=name, four_over_six=spec.four_over_six,
                               fmt=spec.fmt)
    else:  # rows, or a 16x16 tiling of the tensor itself (the torch path does the same: OperandSpec.transpose_invariant)
        out = quantize_rows(tensor, two_d=spec.tile == (16, 16), stochastic=stochastic, seed=seed,
                            generator=generator, out_dtype=out_dtype, amax=None if scales is None else scales[2:],
                            name=name, four_over_six=spec.four_over_six, fmt=spec.fmt)
    return (out.values.t() if transpose else out.values), out.decode_scale.reshape(())
