"""Triton kernels for MXFP4 quantize-dequantize (OCP MX v1.0): the emulated GEMM operands, fused.

MXFP4: E2M1 elements, one E8M0 (power-of-two) scale per 32-element block, no per-tensor scale.
Each kernel's torch reference is defined next to it (``quantize_rows_ref``, ``quantize_columns_ref``:
``models.quant.formats.quantize(..., "mxfp4")``, after ``models.quant.rht.rht`` for the RHT
variant), and the kernels equal it bit for bit (element codes, E8M0 scale codes, scaled values
q * X), for round-to-nearest and for stochastic rounding given the same uniforms:

- ``quantize_rows(x)``: 1x32 blocks along the last dim (X and W for Fprop, dY for Dgrad).
- ``quantize_columns(x, rht=...)``: 32x1 blocks along dim 0, i.e. ``quantize(rht(x.t()))`` (W^T for
  Dgrad, dY^T and X^T along tokens for Wgrad), written back in x's own [rows, cols] layout (scales
  [rows / 32, cols]) so that no transpose is materialized.

One launch each: no amax pass, as MX has no per-tensor scale. Per block (the reference's formulas,
``formats/mx.py``): amax = max |x| (NaN -> Inf), X = 2^(floor(log2 amax) - 2) clamped to
[2^-127, 2^127], i.e. the E8M0 code max(e - 2, 0) for the biased fp32 exponent e of amax (0 for
zero and subnormal amax), code 255 (NaN) for a non-finite amax; then q = e2m1(x * 2^(127 - code)),
which is x / X exactly (a power of two, no overflow), and the value q * X.

Stochastic rounding's bits (the draw the tests re-implement in numpy, quant_oracles.py): per 16
consecutive elements of a block (two per block), one Philox4x32-10 call ``tl.randint4x(seed,
offset)``, key = the 64-bit seed as (low, high) 32 bits, counter = (offset low, offset high, 0, 0),
offset = the flat index r * cols + c in x's [rows, cols] storage of the first of the 16 elements.
Of its four 32-bit words:
- rows kernel (16 elements along a row): element 4 p + b takes byte b of word (w0, w2, w1, w3)[p];
- columns kernel (16 elements down a column): element (row) 4 w + b takes byte b of word w.
A byte v gives the uniform (v + 1/2) / 256, and |v| rounds up iff uniform < (|v| - lo) / (hi - lo).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from models.quant.formats import QuantizedTensor, quantize
from models.quant.kernels.fp4_common import KERNEL_INPUT_DTYPES
from models.quant.kernels.options import MX_OPTIONS, MxOptions
from models.quant.kernels.triton_common import (
    bf16_rounding_mode,
    check_input,
    enabled,
    seed_tensor,
    tl,
    triton,
)
from models.quant.rht import rht as random_hadamard_transform

BLOCK = 32


def _rounding(uniform: Optional[torch.Tensor]) -> str:
    return "nearest" if uniform is None else "stochastic"


def quantize_rows_ref(x: torch.Tensor, *, uniform: Optional[torch.Tensor] = None) -> QuantizedTensor:
    """The torch reference of ``quantize_rows``: RNE, or stochastic rounding with these uniforms
    ([rows, cols], one per element of x)."""
    return quantize(x, "mxfp4", rounding=_rounding(uniform), uniform=uniform)


def quantize_columns_ref(x: torch.Tensor, *, rht: bool = False,
                         uniform: Optional[torch.Tensor] = None) -> QuantizedTensor:
    """The torch reference of ``quantize_columns``, in the operand's [cols, rows] layout (the
    kernel's outputs transposed); ``uniform`` [rows, cols], one per element of x."""
    operand = random_hadamard_transform(x.t()) if rht else x.t()
    return quantize(operand, "mxfp4", rounding=_rounding(uniform), uniform=None if uniform is None else uniform.t())


@dataclass
class MxKernelQuantized:
    """Output of a kernel, in the input's [rows, cols] layout.

    values: q * X (the scaled values), ``out_dtype``.
    block_scales: float8_e8m0fnu; rows: [rows, cols/32]; columns: [rows/32, cols].
    codes: uint8 E2M1 codes [rows, cols] (bit 3 sign), or None when not asked for.
    """

    values: torch.Tensor
    block_scales: torch.Tensor
    codes: Optional[torch.Tensor]


if triton is not None:
    # Imported under their own names: Inductor splices each jit helper's source under its __name__.
    from models.quant.kernels.fp4_common import (
        load_16_rows,
        max_abs_16,
        quantize_store_4_rows,
        random_uniforms_16,
        rht16,
        round_e2m1,
        tile_of_program,
    )
    from models.quant.kernels.triton_common import abs_nan_to_inf, nan_fp32

    @triton.jit
    def e8m0_scale(amax, ELEMENT_EMAX: tl.constexpr):
        """(uint8 E8M0 code, X, 1/X) of the block amax >= 0 (+Inf for NaN/Inf), all exact:
        code = max(e - ELEMENT_EMAX, 0) for amax's biased exponent e, 255 with X and 1/X NaN if amax
        is not finite. X = 2^(code - 127) (code 0: 2^-127, the fp32 subnormal 0x00400000)."""
        biased = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
        finite = biased < 255
        code = tl.maximum(biased - ELEMENT_EMAX, 0)
        scale = tl.where(code == 0, 0x00400000, code << 23).to(tl.float32, bitcast=True)
        inverse = ((254 - code) << 23).to(tl.float32, bitcast=True)
        scale = tl.where(finite, scale, nan_fp32())
        inverse = tl.where(finite, inverse, nan_fp32())
        return tl.where(finite, code, 255).to(tl.uint8), scale, inverse

    @triton.jit
    def _quantize_rows_kernel(
        x_ptr,
        values_ptr,
        codes_ptr,
        scales_ptr,
        seed_ptr,
        rows,
        cols,
        BLOCK_R: tl.constexpr,
        BLOCK_C: tl.constexpr,
        STOCHASTIC: tl.constexpr,
        WRITE_CODES: tl.constexpr,
    ):
        """One [BLOCK_R, BLOCK_C] tile of 1x32 blocks along cols."""
        pid_r, pid_c = tile_of_program(tl.cdiv(cols, BLOCK_C), False)
        row = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        col = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = (row < rows)[:, None] & (col < cols)[None, :]
        offsets = row.to(tl.int64)[:, None] * cols + col[None, :]
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        x3 = tl.reshape(x, [BLOCK_R, BLOCK_C // 32, 32])
        code, scale, inverse = e8m0_scale(tl.max(abs_nan_to_inf(x3), axis=2), 2)  # [BLOCK_R, BLOCK_C / 32]
        scale_cols = cols // 32
        scale_col = pid_c * (BLOCK_C // 32) + tl.arange(0, BLOCK_C // 32)
        scale_mask = (row < rows)[:, None] & (scale_col < scale_cols)[None, :]
        tl.store(scales_ptr + row.to(tl.int64)[:, None] * scale_cols + scale_col[None, :], code, mask=scale_mask)
        scaled = x3 * inverse[:, :, None]
        if STOCHASTIC:
            # One Philox call per 16 elements (two per block), counter = the first one's offset.
            half_col = pid_c * BLOCK_C + 16 * tl.arange(0, BLOCK_C // 16)
            half_offsets = row.to(tl.int64)[:, None] * cols + half_col[None, :]  # [BLOCK_R, BLOCK_C / 16]
            uniform = tl.reshape(random_uniforms_16(tl.load(seed_ptr), half_offsets), [BLOCK_R, BLOCK_C // 32, 32])
        else:
            uniform = scaled
        value, code_e2m1 = round_e2m1(scaled, uniform, STOCHASTIC)
        value = tl.reshape(value * scale[:, :, None], [BLOCK_R, BLOCK_C])
        tl.store(values_ptr + offsets, value.to(values_ptr.dtype.element_ty), mask=mask)
        if WRITE_CODES:
            tl.store(codes_ptr + offsets, tl.reshape(code_e2m1, [BLOCK_R, BLOCK_C]), mask=mask)

    @triton.jit
    def _quantize_columns_kernel(
        x_ptr,
        values_ptr,
        codes_ptr,
        scales_ptr,
        seed_ptr,
        groups,
        cols,
        GROUPS: tl.constexpr,
        BLOCK_C: tl.constexpr,
        RHT: tl.constexpr,
        ROUND_BF16: tl.constexpr,  # 0: none (fp32 input), 1: integer RNE, 2: hardware RNE
        STOCHASTIC: tl.constexpr,
        WRITE_CODES: tl.constexpr,
    ):
        """GROUPS groups of 32 rows x BLOCK_C cols; blocks are 32x1 (down the columns), each two
        16-row halves (the RHT's tiles)."""
        pid_g, pid_c = tile_of_program(tl.cdiv(cols, BLOCK_C), False)
        group = pid_g * GROUPS + tl.arange(0, GROUPS)
        col = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = (group < groups)[:, None] & (col < cols)[None, :]
        low = (group.to(tl.int64) * 32)[:, None] * cols + col[None, :]  # rows 32 g .. 32 g + 15
        high = low + 16 * cols  # rows 32 g + 16 .. 32 g + 31
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = load_16_rows(x_ptr + low, cols, mask)
        b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15 = load_16_rows(x_ptr + high, cols, mask)
        if RHT:
            a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = rht16(
                a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, ROUND_BF16)
            b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15 = rht16(
                b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15, ROUND_BF16)
        amax = tl.maximum(
            max_abs_16(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, NAN_TO_INF=True),
            max_abs_16(b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15, NAN_TO_INF=True))
        code, scale, inverse = e8m0_scale(amax, 2)
        tl.store(scales_ptr + group.to(tl.int64)[:, None] * cols + col[None, :], code, mask=mask)
        if STOCHASTIC:
            # One Philox call per 16x1 half block (counter = its first element's offset): row 4 w + b
            # of the half takes byte b of word w.
            seed = tl.load(seed_ptr)
            wa0, wa1, wa2, wa3 = tl.randint4x(seed, low)
            wb0, wb1, wb2, wb3 = tl.randint4x(seed, high)
        else:
            wa0 = 0
            wa1 = 0
            wa2 = 0
            wa3 = 0
            wb0 = 0
            wb1 = 0
            wb2 = 0
            wb3 = 0
        quantize_store_4_rows(a0, a1, a2, a3, 0, inverse, scale, low, cols, mask, values_ptr, codes_ptr, wa0,
                              STOCHASTIC, WRITE_CODES)
        quantize_store_4_rows(a4, a5, a6, a7, 4, inverse, scale, low, cols, mask, values_ptr, codes_ptr, wa1,
                              STOCHASTIC, WRITE_CODES)
        quantize_store_4_rows(a8, a9, a10, a11, 8, inverse, scale, low, cols, mask, values_ptr, codes_ptr, wa2,
                              STOCHASTIC, WRITE_CODES)
        quantize_store_4_rows(a12, a13, a14, a15, 12, inverse, scale, low, cols, mask, values_ptr, codes_ptr, wa3,
                              STOCHASTIC, WRITE_CODES)
        quantize_store_4_rows(b0, b1, b2, b3, 0, inverse, scale, high, cols, mask, values_ptr, codes_ptr, wb0,
                              STOCHASTIC, WRITE_CODES)
        quantize_store_4_rows(b4, b5, b6, b7, 4, inverse, scale, high, cols, mask, values_ptr, codes_ptr, wb1,
                              STOCHASTIC, WRITE_CODES)
        quantize_store_4_rows(b8, b9, b10, b11, 8, inverse, scale, high, cols, mask, values_ptr, codes_ptr, wb2,
                              STOCHASTIC, WRITE_CODES)
        quantize_store_4_rows(b12, b13, b14, b15, 12, inverse, scale, high, cols, mask, values_ptr, codes_ptr, wb3,
                              STOCHASTIC, WRITE_CODES)


def _outputs(x: torch.Tensor, scales_shape, out_dtype: torch.dtype, write_codes: bool):
    values = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    codes = torch.empty(x.shape, dtype=torch.uint8, device=x.device) if write_codes else values
    scales = torch.empty(scales_shape, dtype=torch.uint8, device=x.device)
    return values, codes, scales


def _result(values, codes, scales, write_codes: bool) -> MxKernelQuantized:
    return MxKernelQuantized(values, scales.view(torch.float8_e8m0fnu), codes if write_codes else None)


def quantize_rows(
    x: torch.Tensor,
    *,
    stochastic: bool = False,
    seed=None,
    generator: Optional[torch.Generator] = None,
    out_dtype: torch.dtype = torch.bfloat16,
    write_codes: bool = False,
    name: Optional[str] = None,
    options: MxOptions = MX_OPTIONS,
) -> MxKernelQuantized:
    """MXFP4 of a [rows, cols] CUDA tensor with 1x32 blocks along cols (cols % 32 == 0).

    Equals ``quantize_rows_ref(x)`` (RNE), or, with ``stochastic``, ``quantize_rows_ref(x,
    uniform=...)`` with the uniforms of the module docstring. ``seed`` (int or 1-element tensor) or
    ``generator`` seeds stochastic rounding; by default a seed is drawn from torch's global RNG on
    x's device (no host sync).
    """
    check_input(x, dtypes=KERNEL_INPUT_DTYPES, cols_multiple=BLOCK, rows_multiple=1, what="mxfp4 quantize_rows",
                name=name)
    x = x.contiguous()
    rows, cols = x.shape
    block_r, block_c, warps = options.rows_launch(cols)
    values, codes, scales = _outputs(x, (rows, cols // BLOCK), out_dtype, write_codes)
    seed = seed_tensor(x, seed, generator) if stochastic else scales
    grid = (triton.cdiv(rows, block_r) * triton.cdiv(cols, block_c),)
    _quantize_rows_kernel[grid](
        x, values, codes, scales, seed, rows, cols, BLOCK_R=block_r, BLOCK_C=block_c, STOCHASTIC=stochastic,
        WRITE_CODES=write_codes, num_warps=warps, enable_fp_fusion=False, enable_reflect_ftz=False,
    )
    return _result(values, codes, scales, write_codes)


def quantize_columns(
    x: torch.Tensor,
    *,
    rht: bool = False,
    stochastic: bool = False,
    seed=None,
    generator: Optional[torch.Generator] = None,
    out_dtype: torch.dtype = torch.bfloat16,
    write_codes: bool = False,
    name: Optional[str] = None,
    options: MxOptions = MX_OPTIONS,
) -> MxKernelQuantized:
    """MXFP4 of x [rows, cols] with 32x1 blocks along rows (rows % 32 == 0), optionally after the RHT
    along rows (16-row tiles). Equals ``quantize_columns_ref(x, rht=rht)`` (RNE; with
    ``stochastic``, given the module docstring's uniforms) transposed back: outputs in x's layout,
    scales [rows / 32, cols]."""
    check_input(x, dtypes=KERNEL_INPUT_DTYPES, cols_multiple=1, rows_multiple=BLOCK, what="mxfp4 quantize_columns",
                name=name)
    x = x.contiguous()
    rows, cols = x.shape
    groups_per_program, block_c, warps = options.columns_stochastic if stochastic else options.columns
    values, codes, scales = _outputs(x, (rows // BLOCK, cols), out_dtype, write_codes)
    seed = seed_tensor(x, seed, generator) if stochastic else scales
    grid = (triton.cdiv(rows // BLOCK, groups_per_program) * triton.cdiv(cols, block_c),)
    _quantize_columns_kernel[grid](
        x, values, codes, scales, seed, rows // BLOCK, cols, GROUPS=groups_per_program, BLOCK_C=block_c, RHT=rht,
        ROUND_BF16=bf16_rounding_mode(x, options.bf16_rounding), STOCHASTIC=stochastic, WRITE_CODES=write_codes,
        num_warps=warps, enable_fp_fusion=False, enable_reflect_ftz=False,
    )
    return _result(values, codes, scales, write_codes)


# ----------------------------------------------------------------------------------------------
# The operand interface of models.quant.linear (FormatSpec.quantize_kernel == "mx"). ``spec`` is an
# OperandSpec; the operand is ``tensor.t() if transpose else tensor``.


def operand_supported(tensor: torch.Tensor, spec, transpose: bool) -> bool:
    """Whether the kernels quantize this operand (else the layer runs the torch reference)."""
    if spec.fmt != "mxfp4" or spec.tile != (1, BLOCK):
        return False
    if not (enabled() and tensor.is_cuda and tensor.dtype in KERNEL_INPUT_DTYPES and tensor.ndim == 2):
        return False
    if spec.rht and not transpose:  # the kernels apply the RHT along dim 0 only (Wgrad's case)
        return False
    return tensor.shape[0 if transpose else 1] % BLOCK == 0


def shared_scales(tensor: torch.Tensor, rows_spec, columns_spec) -> None:
    """MXFP4 has no per-tensor scale: nothing to share between an operand's two orientations."""
    return None


def quantize_operand(tensor: torch.Tensor, spec, *, transpose: bool, seed: Optional[torch.Tensor],
                     generator: Optional[torch.Generator], out_dtype: torch.dtype, scales: Optional[torch.Tensor],
                     name: str) -> Tuple[torch.Tensor, None]:
    """(q * X [operand rows, reduction] in ``out_dtype``, None: no per-tensor decode scale)."""
    stochastic = spec.rounding == "stochastic"
    if transpose:
        out = quantize_columns(tensor, rht=spec.rht, stochastic=stochastic, seed=seed, generator=generator,
                               out_dtype=out_dtype, name=name)
        return out.values.t(), None
    out = quantize_rows(tensor, stochastic=stochastic, seed=seed, generator=generator, out_dtype=out_dtype, name=name)
    return out.values, None
