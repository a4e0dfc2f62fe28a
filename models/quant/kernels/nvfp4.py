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

Codes only (``write_values=False``; ``models.quant.nvfp4_torch`` asks for it, a native FP4 GEMM reading no
values): kernels of their own (``_quantize_rows_codes_kernel``, ``_quantize_columns_codes_kernel``,
``_quantize_rows_four_over_six_codes_kernel``, on the same tile bodies as the values kernels, whose launch
signatures stay as they were) skip the scaled values and write the E2M1 codes packed two a byte, element 2j in
the low nibble (torch's ``float4_e2m1fn_x2``), in the GEMM operand's layout: the rows kernels [rows, cols / 2],
the 16x16 one also (``transposed_codes``) x^T's [cols, rows / 2] from the same pass (Dgrad's W^T), the columns
kernel the operand x^T's [cols, rows / 2], packed along x's rows. A block's 16 codes are one 64-bit word (code
j in bits 4j .. 4j + 3: little-endian, those are its 8 packed bytes), stored as one int64. The packed rows are
zero-padded to ``packed_multiple`` codes (torch's GEMM takes multiples of 32): the grid covers the padding, whose
elements load as zeros and so get zero codes. Codes, scales and random draws are the values path's, bit for
bit; 0.5 bytes an element written instead of 2 (bf16 values) + 1 (codes).

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
    """Output of a kernel, in the input's [rows, cols] layout (packed codes: in the layout named below).

    values: q * s_b (scaled values, without the per-tensor decode scale), ``out_dtype``; None when the
        kernel wrote codes only (``write_values=False``).
    block_scales: float8_e4m3fn (uint8 UE5M3 codes for nvfp4_ue5m3); rows: [rows, cols/16];
        two_d: [rows/16, cols/16]; columns: [rows/16, cols].
    decode_scale: fp32 [1], 1/S_enc (NaN if the input had NaN/Inf).
    codes: uint8 E2M1 codes [rows, cols] (bit 3 sign), or None when not asked for. Codes only: packed two a
        byte (element 2j in the low nibble) along the GEMM operand's reduction, zero-padded to
        ``packed_multiple`` codes: rows kernels [rows, cols'/2]; columns kernel the operand x^T's [cols, rows'/2].
    transposed_codes: codes only, two_d: x^T's codes packed the same way, [cols, rows'/2]; else None.
    """

    values: Optional[torch.Tensor]
    block_scales: torch.Tensor
    decode_scale: torch.Tensor
    codes: Optional[torch.Tensor]
    transposed_codes: Optional[torch.Tensor] = None


if triton is not None:
    # Imported under their own names: Inductor compiles a kernel called inside torch.compile by
    # splicing the source of every jit helper it calls, which defines the helper under its
    # __name__; an alias would leave the kernel calling an undefined name.
    from models.quant.kernels.nvfp4_tiles import columns_tile, rows_four_over_six_tile, rows_tile

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
        """The values (and, WRITE_CODES, one code a byte) of x, in x's layout: ``rows_tile``."""
        rows_tile(x_ptr, values_ptr, codes_ptr, codes_ptr, scales_ptr, global_ptr, amax_ptr, seed_ptr, rows, cols,
                  rows, cols, BLOCK_R, BLOCK_C, TWO_D, STOCHASTIC, WRITE_CODES, True, False, SCALES_FROM_AMAX, UE5M3)

    @triton.jit
    def _quantize_rows_codes_kernel(
        x_ptr,
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
        TRANSPOSED_CODES: tl.constexpr,
        SCALES_FROM_AMAX: tl.constexpr,
        UE5M3: tl.constexpr,
    ):
        """Codes only, packed (``rows_tile`` without WRITE_VALUES): no values pointer at all."""
        rows_tile(x_ptr, codes_ptr, codes_ptr, transposed_ptr, scales_ptr, global_ptr, amax_ptr, seed_ptr, rows,
                  cols, code_rows, code_cols, BLOCK_R, BLOCK_C, TWO_D, STOCHASTIC, WRITE_CODES, False,
                  TRANSPOSED_CODES, SCALES_FROM_AMAX, UE5M3)

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
        """The values (and, WRITE_CODES, one code a byte) in x's layout: ``columns_tile``."""
        columns_tile(x_ptr, values_ptr, codes_ptr, scales_ptr, global_ptr, amax_ptr, seed_ptr, groups, cols, groups,
                     GROUPS, BLOCK_C, RHT, ROUND_BF16, STOCHASTIC, WRITE_CODES, True, SCALES_FROM_AMAX, FOUR_OVER_SIX,
                     UE5M3)

    @triton.jit
    def _quantize_columns_codes_kernel(
        x_ptr,
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
        ROUND_BF16: tl.constexpr,
        STOCHASTIC: tl.constexpr,
        SCALES_FROM_AMAX: tl.constexpr,
        FOUR_OVER_SIX: tl.constexpr,
        UE5M3: tl.constexpr,
    ):
        """Codes only, packed in the operand x^T's layout (``columns_tile`` without WRITE_VALUES)."""
        columns_tile(x_ptr, codes_ptr, codes_ptr, scales_ptr, global_ptr, amax_ptr, seed_ptr, groups, cols,
                     code_groups, GROUPS, BLOCK_C, RHT, ROUND_BF16, STOCHASTIC, True, False, SCALES_FROM_AMAX,
                     FOUR_OVER_SIX, UE5M3)

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
        """The values (and, WRITE_CODES, one code a byte) of x, in x's layout: ``rows_four_over_six_tile``."""
        rows_four_over_six_tile(x_ptr, values_ptr, codes_ptr, codes_ptr, scales_ptr, global_ptr, amax_ptr, seed_ptr,
                                rows, cols, rows, cols, BLOCK_R, BLOCKS, TWO_D, STOCHASTIC, WRITE_CODES, True, False,
                                FOUR_OVER_SIX, IN_PIECE, OUT_PIECE)

    @triton.jit
    def _quantize_rows_four_over_six_codes_kernel(
        x_ptr,
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
        TRANSPOSED_CODES: tl.constexpr,
        FOUR_OVER_SIX: tl.constexpr,
        IN_PIECE: tl.constexpr,
    ):
        """Codes only, packed (``rows_four_over_six_tile`` without WRITE_VALUES): no values pointer at all."""
        rows_four_over_six_tile(x_ptr, codes_ptr, codes_ptr, transposed_ptr, scales_ptr, global_ptr, amax_ptr,
                                seed_ptr, rows, cols, code_rows, code_cols, BLOCK_R, BLOCKS, TWO_D, STOCHASTIC,
                                WRITE_CODES, False, TRANSPOSED_CODES, FOUR_OVER_SIX, IN_PIECE, 16)


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
    return values, codes, _scales(x, scales_shape, ue5m3)


def _scales(x, scales_shape, ue5m3):
    return torch.empty(scales_shape, dtype=torch.uint8 if ue5m3 else torch.float8_e4m3fn, device=x.device)


def _padded(size: int, multiple: int) -> int:
    return -(-size // multiple) * multiple


def _check_codes_only(write_codes: bool, transposed_codes: bool, packed_multiple: int) -> None:
    if not (write_codes or transposed_codes):
        raise ValueError("nvfp4 kernels with write_values=False write codes only: ask for write_codes "
                         "(or transposed_codes)")
    if packed_multiple <= 0 or packed_multiple % 16:
        raise ValueError(f"packed_multiple must be a positive multiple of 16, got {packed_multiple}")


def quantize_rows(
    x: torch.Tensor,
    *,
    two_d: bool = False,
    stochastic: bool = False,
    seed=None,
    generator: Optional[torch.Generator] = None,
    out_dtype: torch.dtype = torch.bfloat16,
    write_codes: bool = False,
    write_values: bool = True,
    transposed_codes: bool = False,
    packed_multiple: int = 16,
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

    Codes only (``write_values=False``, what a native FP4 GEMM takes): no values are written (``values`` is
    None) and the codes come packed two a byte, element 2j in the low nibble (torch's ``float4_e2m1fn_x2``):
    ``codes`` [rows, round_up(cols, packed_multiple) / 2] with ``write_codes``, and, two_d only,
    ``transposed_codes`` [cols, round_up(rows, packed_multiple) / 2], the codes of x^T (a 16x16 tile is a
    tile of the transpose, with the same scale). Codes past x's extent are zeros. The codes, scales and
    stochastic draws are those of the values path, bit for bit.
    """
    _check(x, 16 if two_d else 1, "nvfp4 quantize_rows", name)
    ue5m3 = _check_variant(fmt, four_over_six)
    if transposed_codes and (write_values or not two_d):
        raise ValueError("nvfp4 quantize_rows writes transposed codes for two_d with write_values=False only")
    if not write_values:
        _check_codes_only(write_codes, transposed_codes, packed_multiple)
    x = x.contiguous()
    rows, cols = x.shape
    global_scales, amax = _global_scales_or_amax(x, rht=False, given=amax, options=options)
    scales_shape = (rows // 16, cols // 16) if two_d else (rows, cols // 16)
    seed = seed_tensor(x, seed, generator) if stochastic else global_scales
    if not write_values:
        return _rows_codes(x, two_d=two_d, stochastic=stochastic, seed=seed, write_codes=write_codes,
                           transposed_codes=transposed_codes, packed_multiple=packed_multiple,
                           global_scales=global_scales, amax=amax, scales=_scales(x, scales_shape, ue5m3),
                           four_over_six=four_over_six, ue5m3=ue5m3, options=options)
    values, codes, scales = _outputs(x, scales_shape, out_dtype, write_codes, ue5m3)
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


def _rows_codes(x, *, two_d, stochastic, seed, write_codes, transposed_codes, packed_multiple, global_scales, amax,
                scales, four_over_six, ue5m3, options) -> KernelQuantized:
    """``quantize_rows`` with write_values=False: the codes kernels, the grid over the packed extents."""
    rows, cols = x.shape
    code_rows = _padded(rows, packed_multiple) if transposed_codes else rows
    code_cols = _padded(cols, packed_multiple) if write_codes else cols
    # One int64 word per 16-code block, what the kernels store; its bytes are the packed codes (a uint8 view).
    words = torch.empty(rows, code_cols // 16, dtype=torch.int64, device=x.device) if write_codes else None
    transposed = torch.empty(cols, code_rows // 16, dtype=torch.int64, device=x.device) if transposed_codes else None
    codes_arg = words if words is not None else transposed  # the other pointer is never stored through
    transposed_arg = transposed if transposed is not None else words
    if four_over_six is not None:
        block_r, block_c, warps = options.two_d_four_over_six if two_d else options.rows_four_over_six
        grid = (triton.cdiv(code_rows, block_r) * triton.cdiv(code_cols // 16, block_c // 16),)
        _quantize_rows_four_over_six_codes_kernel[grid](
            x, codes_arg, transposed_arg, scales.view(torch.uint8), global_scales, amax, seed, rows, cols, code_rows,
            code_cols, BLOCK_R=block_r, BLOCKS=block_c // 16, TWO_D=two_d, STOCHASTIC=stochastic,
            WRITE_CODES=write_codes, TRANSPOSED_CODES=transposed_codes, FOUR_OVER_SIX=four_over_six_code(four_over_six),
            IN_PIECE=16 // x.element_size(), num_warps=warps, enable_fp_fusion=False,
        )
    else:
        block_r, block_c, warps = options.two_d if two_d else options.rows_launch(cols)
        grid = (triton.cdiv(code_rows, block_r) * triton.cdiv(code_cols, block_c),)
        _quantize_rows_codes_kernel[grid](
            x, codes_arg, transposed_arg, scales.view(torch.uint8), global_scales, amax, seed, rows, cols, code_rows,
            code_cols, BLOCK_R=block_r, BLOCK_C=block_c, TWO_D=two_d, STOCHASTIC=stochastic, WRITE_CODES=write_codes,
            TRANSPOSED_CODES=transposed_codes, SCALES_FROM_AMAX=True, UE5M3=ue5m3, num_warps=warps,
            enable_fp_fusion=False,
        )
    return KernelQuantized(None, scales, global_scales[1:2], None if words is None else words.view(torch.uint8),
                           None if transposed is None else transposed.view(torch.uint8))


def quantize_columns(
    x: torch.Tensor,
    *,
    rht: bool = False,
    stochastic: bool = False,
    seed=None,
    generator: Optional[torch.Generator] = None,
    out_dtype: torch.dtype = torch.bfloat16,
    write_codes: bool = False,
    write_values: bool = True,
    packed_multiple: int = 16,
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

    Codes only (``write_values=False`` with ``write_codes``): no values (``values`` is None), and ``codes`` are
    the operand x^T's, packed two a byte along x's rows (the operand's reduction), element 2j in the low
    nibble: [cols, round_up(rows, packed_multiple) / 2], row-major, the codes past x's rows zeros. Scales stay
    [rows / 16, cols] (their transpose is a view, and the GEMM's layout copies them anyway). The codes, scales
    and stochastic draws are those of the values path, bit for bit.
    """
    if global_scales is not None and not rht:
        raise ValueError("nvfp4 quantize_columns takes precomputed global_scales with rht=True only")
    _check(x, 16, "nvfp4 quantize_columns", name)
    ue5m3 = _check_variant(fmt, four_over_six)
    if not write_values:
        _check_codes_only(write_codes, False, packed_multiple)
    x = x.contiguous()
    rows, cols = x.shape
    groups_per_program, block_c, warps = options.columns_stochastic if stochastic else options.columns
    global_scales, amax = _global_scales_or_amax(x, rht=rht, given=global_scales, options=options,
                                                 four_over_six=four_over_six is not None, fmt=fmt)
    seed = seed_tensor(x, seed, generator) if stochastic else global_scales
    round_bf16 = bf16_rounding_mode(x, options.bf16_rounding)
    if not write_values:
        code_rows = _padded(rows, packed_multiple)
        words = torch.empty(cols, code_rows // 16, dtype=torch.int64, device=x.device)  # one a 16x1 block
        scales = _scales(x, (rows // 16, cols), ue5m3)
        grid = (triton.cdiv(code_rows // 16, groups_per_program) * triton.cdiv(cols, block_c),)
        _quantize_columns_codes_kernel[grid](
            x, words, scales.view(torch.uint8), global_scales, amax, seed, rows // 16, cols,
            code_rows // 16, GROUPS=groups_per_program, BLOCK_C=block_c, RHT=rht, ROUND_BF16=round_bf16,
            STOCHASTIC=stochastic, SCALES_FROM_AMAX=amax is not global_scales,
            FOUR_OVER_SIX=four_over_six_code(four_over_six), UE5M3=ue5m3, num_warps=warps, enable_fp_fusion=False,
        )
        return KernelQuantized(None, scales, global_scales[1:2], words.view(torch.uint8))
    values, codes, scales = _outputs(x, (rows // 16, cols), out_dtype, write_codes, ue5m3)
    grid = (triton.cdiv(rows // 16, groups_per_program) * triton.cdiv(cols, block_c),)
    _quantize_columns_kernel[grid](
        x, values, codes, scales.view(torch.uint8), global_scales, amax, seed, rows // 16, cols,
        GROUPS=groups_per_program, BLOCK_C=block_c, RHT=rht, ROUND_BF16=round_bf16,
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
    local = local_amax(tensor, spec, transpose)
    return None if local is None else scales_from_amax(reduce_amax(local), spec, transpose)


def local_amax(tensor: torch.Tensor, spec, transpose: bool) -> Optional[torch.Tensor]:
    """This shard's amax (fp32 [1]) as ``group_scales`` takes it, from the kernels' own pass: of the RHT'd
    values for Wgrad's columns; None where the kernels take no given scales (columns without the RHT)."""
    if transpose and spec.tile == (1, 16):
        if not spec.rht:
            return None
        return rht_global_scales(tensor, four_over_six=spec.four_over_six is not None, fmt=spec.fmt)[3:4]
    return tensor_amax(tensor.contiguous())  # rows, or a 16x16 tiling of the tensor itself


def scales_from_amax(amax: torch.Tensor, spec, transpose: bool) -> Optional[torch.Tensor]:
    """``group_scales``' result from the group's amax (fp32 [1], already reduced); None where ``local_amax`` is."""
    if transpose and spec.tile == (1, 16):
        if not spec.rht:
            return None
        return global_scales_from_amax(amax, four_over_six=spec.four_over_six is not None, fmt=spec.fmt)
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
