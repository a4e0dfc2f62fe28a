"""Triton kernel for blockwise and per-tensor FP8 (E4M3) quantization: both orientations of a tensor.

Its torch reference is ``quantize_ref`` (``models.quant.fp8_operand.quantize_reference``:
``formats.quantize(..., "fp8_block" / "fp8_tensor")`` with the scales laid out for the GEMM). What it
computes is exactly that (TE ``Float8BlockScaling``, ``recipe_common.cuh: compute_scale_from_amax``
with epsilon 0), in fp32:

    amax    = max |x| over the block                      (NaN counts as +Inf)
    scale   = 448 / amax;  scale = max finite value of x's dtype if that is +Inf
    scale   = 1 if amax == 0 or amax is not finite
    scale   = scale with its 23 mantissa bits cleared     (power_of_two: round down to 2^k)
    decode  = 1 / scale;   decode = NaN if amax is not finite
    code    = e4m3(clamp(x * scale, -448, 448))           round half to even

One program per tile. Modes:
- 1D (activations, gradients): the 1x128 blocks along each row (the "rows" output: the operand ``x``
  itself, [rows, cols], blocks along cols) and the 128x1 blocks along each column (the "columns"
  output: the operand ``x^T``, written transposed as [cols, rows], blocks along rows), as TE's
  cast-transpose kernels do for X (Fprop and Wgrad) and dY (Dgrad and Wgrad). Asked for both, a
  rows-only pass over [rows_pass_tile_rows, 128] tiles and a columns-only pass over
  [128, columns_pass_tile_cols] tiles (``Fp8Options``).
- 2D (weights): one scale for the whole 128x128 tile, read once; "rows" is W [rows, cols] and
  "columns" is W^T [cols, rows] with the same codes transposed, which is exactly quantize(W^T) (a
  square tile is the same tile of the transpose).
- Per tensor (fp8_tensor, TE ``Float8CurrentScaling``): one scale for the whole tensor, from its
  amax (torch's max-abs reduction, one pass before the kernel; every program derives the same scale
  from it); "rows" is x and "columns" x^T, the same codes transposed. The scale's replacement for an
  infinite value is FLT_MAX there (formats' fp8_tensor), not the input dtype's maximum.

Outputs are written straight into the layouts ``torch.nn.functional.scaled_mm`` takes on Hopper
(cuBLASLt's DeepSeek-style block scaling), so nothing is copied afterwards. For an operand
``A [m, r]`` (reduction dim r last, row-major):
- codes: float8_e4m3fn [m, r], contiguous.
- 1x128 decode scales: shape [m, r/128], strides (1, m) ("outer-dim-major"): storage [r/128, m].
- 128x128 decode scales: shape [L4, m/128], strides (1, L4) with L4 = round_up(r/128, 4):
  storage [m/128, L4] whose columns r/128 .. L4-1 are zero padding cuBLASLt asks for.

Exactness: the two divisions are ``tl.math.div_rn`` (IEEE round-to-nearest, as torch's ``/``);
``x * scale`` is a single fp32 multiply; E4M3 rounding is ``e4m3_round`` (triton_common); launches
pass ``enable_fp_fusion=False`` and ``enable_reflect_ftz=False`` (subnormal inputs are not flushed:
a block of tiny values takes the huge-scale path, as in torch). The GPU tests check bit identity
with ``quantize_ref`` on fresh inputs, and Triton's interpreter runs the kernel on the CPU.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from models.quant.fp8_operand import BLOCK, round_up
from models.quant.fp8_operand import quantize_reference as quantize_ref  # noqa: F401 - the torch reference
from models.quant.kernels.options import FP8_OPTIONS, Fp8Options
from models.quant.kernels.triton_common import INSTALL_HINT, INTERPRETING, enabled, tl, triton

KERNEL_INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def supports(x: torch.Tensor) -> bool:
    """Whether ``x`` can go through the kernel: switched on, CUDA, bf16/fp16/fp32, 2D."""
    return enabled() and x.is_cuda and x.dtype in KERNEL_INPUT_DTYPES and x.ndim == 2


if triton is not None:
    from models.quant.kernels.triton_common import abs_nan_to_inf, e4m3_round, nan_fp32

    @triton.jit
    def _scale_and_decode(amax, value_for_inf, POWER_OF_TWO: tl.constexpr):
        """(scale, decode) of fp32 block amax >= 0 (+Inf for NaN/Inf blocks), TE's order."""
        flt_max = 3.4028234663852886e38
        scale = tl.math.div_rn(tl.full(amax.shape, 448.0, tl.float32), amax)
        # value_for_inf arrives as fp64 when Inductor launches the kernel (fp32 from a plain launch); it
        # is a bf16/fp32 finfo max, so the cast is exact and the scale stays fp32 for the bitcast below.
        scale = tl.where(scale > flt_max, value_for_inf, scale).to(tl.float32)
        scale = tl.where((amax == 0.0) | (amax > flt_max), 1.0, scale)
        if POWER_OF_TWO:
            scale = (scale.to(tl.int32, bitcast=True) & -8388608).to(tl.float32, bitcast=True)
        decode = tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), scale)
        decode = tl.where(amax > flt_max, nan_fp32(), decode)
        return scale, decode

    @triton.jit
    def _e4m3_code(value):
        """uint8 E4M3 code of fp32 value: saturate to +-448 (NaN kept), round half to even, sign kept."""
        _, code = e4m3_round(tl.abs(value))
        sign = (value.to(tl.int32, bitcast=True) >> 24) & 0x80
        return (code | sign).to(tl.uint8)

    @triton.jit
    def _fp8_block_quantize_kernel(
        x_ptr, stride_x_row, stride_x_col, rows, cols,
        row_codes_ptr, row_scales_ptr, row_scale_stride_row, row_scale_stride_block,
        col_codes_ptr, col_scales_ptr, col_scale_stride_col, col_scale_stride_block,
        value_for_inf, tensor_amax_ptr, tensor_decode_ptr,
        TILE_2D: tl.constexpr, TENSOR_SCALE: tl.constexpr, WRITE_ROWS: tl.constexpr, WRITE_COLUMNS: tl.constexpr,
        ROWS_POWER_OF_TWO: tl.constexpr, COLUMNS_POWER_OF_TWO: tl.constexpr,
        MASK_ROWS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        tile_row = tl.program_id(0)
        tile_col = tl.program_id(1)
        # The tile is [BLOCK_R, BLOCK_C]: 128 x 128 for 2D tiles and for both 1D orientations at once;
        # a rows-only 1D pass needs BLOCK_C == 128 (its blocks run along the columns), a columns-only
        # pass BLOCK_R == 128; per tensor, any shape.
        row_index = tile_row * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R]
        col_index = tile_col * BLOCK_C + tl.arange(0, BLOCK_C)  # [BLOCK_C]
        row_64 = row_index.to(tl.int64)
        col_64 = col_index.to(tl.int64)
        x_offsets = row_64[:, None] * stride_x_row + col_64[None, :] * stride_x_col
        row_offsets = row_64[:, None] * cols + col_64[None, :]  # rows output [rows, cols]
        col_offsets = col_64[:, None] * rows + row_64[None, :]  # columns output [cols, rows]
        row_valid = row_index < rows
        if MASK_ROWS:  # rows-only 1D mode with rows % 128 != 0: the tail rows are masked
            x = tl.load(x_ptr + x_offsets, mask=row_valid[:, None], other=0.0).to(tl.float32)
        else:
            x = tl.load(x_ptr + x_offsets).to(tl.float32)
        magnitude = abs_nan_to_inf(x)  # NaN -> +Inf: never lost by max

        if TENSOR_SCALE:
            # [1]: the tensor's amax (NaN -> +Inf, as abs_nan_to_inf does per element).
            first = tl.zeros([1], dtype=tl.int32)
            amax = tl.load(tensor_amax_ptr + first)
            amax = abs_nan_to_inf(amax)
            scale, decode = _scale_and_decode(amax, value_for_inf, False)
            codes = _e4m3_code(x * scale[:, None])
            if WRITE_ROWS:
                if MASK_ROWS:
                    tl.store(row_codes_ptr + row_offsets, codes, mask=row_valid[:, None])
                else:
                    tl.store(row_codes_ptr + row_offsets, codes)
            if WRITE_COLUMNS:
                tl.store(col_codes_ptr + col_offsets, tl.trans(codes))
            tl.store(tensor_decode_ptr + first, decode, mask=(first == 0) & (tile_row == 0) & (tile_col == 0))
        elif TILE_2D:
            amax = tl.max(tl.max(magnitude, axis=1), axis=0)
            if WRITE_ROWS:
                scale, decode = _scale_and_decode(amax, value_for_inf, ROWS_POWER_OF_TWO)
                tl.store(row_codes_ptr + row_offsets, _e4m3_code(x * scale))
                tl.store(row_scales_ptr + tile_row * row_scale_stride_row + tile_col * row_scale_stride_block, decode)
            if WRITE_COLUMNS:
                scale, decode = _scale_and_decode(amax, value_for_inf, COLUMNS_POWER_OF_TWO)
                tl.store(col_codes_ptr + col_offsets, tl.trans(_e4m3_code(x * scale)))
                tl.store(col_scales_ptr + tile_col * col_scale_stride_col + tile_row * col_scale_stride_block, decode)
        else:
            if WRITE_ROWS:
                scale, decode = _scale_and_decode(tl.max(magnitude, axis=1), value_for_inf, ROWS_POWER_OF_TWO)
                codes = _e4m3_code(x * scale[:, None])
                scale_offsets = row_64 * row_scale_stride_row + tile_col * row_scale_stride_block
                if MASK_ROWS:
                    tl.store(row_codes_ptr + row_offsets, codes, mask=row_valid[:, None])
                    tl.store(row_scales_ptr + scale_offsets, decode, mask=row_valid)
                else:
                    tl.store(row_codes_ptr + row_offsets, codes)
                    tl.store(row_scales_ptr + scale_offsets, decode)
            if WRITE_COLUMNS:
                scale, decode = _scale_and_decode(tl.max(magnitude, axis=0), value_for_inf, COLUMNS_POWER_OF_TWO)
                codes = _e4m3_code(x * scale[None, :])  # [BLOCK_R, BLOCK_C], blocks along rows
                tl.store(col_codes_ptr + col_offsets, tl.trans(codes))
                tl.store(col_scales_ptr + col_64 * col_scale_stride_col + tile_row * col_scale_stride_block, decode)


def _launch(x, row_args, col_args, scalars, *, rows: bool, columns: bool, tile_2d: bool, tensor_scale: bool,
            rows_power_of_two: bool, columns_power_of_two: bool, options: Fp8Options) -> None:
    """Launch the kernel over x's tiles: once, or (1D or per tensor, both orientations asked) a
    rows-only and a columns-only pass with the tile shapes of ``options``."""
    num_rows, num_cols = x.shape
    if rows and columns and not tile_2d:
        passes = ((True, False, options.rows_pass_tile_rows, BLOCK), (False, True, BLOCK, options.columns_pass_tile_cols))
    else:
        passes = ((rows, columns, BLOCK, BLOCK),)
    for write_rows, write_columns, block_r, block_c in passes:
        _fp8_block_quantize_kernel[(triton.cdiv(num_rows, block_r), num_cols // block_c)](
            x, x.stride(0), x.stride(1), num_rows, num_cols, *row_args, *col_args, *scalars,
            TILE_2D=tile_2d, TENSOR_SCALE=tensor_scale, WRITE_ROWS=write_rows, WRITE_COLUMNS=write_columns,
            ROWS_POWER_OF_TWO=rows_power_of_two, COLUMNS_POWER_OF_TWO=columns_power_of_two,
            MASK_ROWS=num_rows % block_r != 0, BLOCK_R=block_r, BLOCK_C=block_c,
            num_warps=options.num_warps, enable_fp_fusion=False, enable_reflect_ftz=False,
        )


def _check_input(x: torch.Tensor, rows: bool, columns: bool, function: str, name: Optional[str]) -> str:
    """Raise on what the kernel cannot take; returns the error prefix naming the operand."""
    where = f"{name}: " if name else ""
    if triton is None:
        raise RuntimeError(f"{where}{function} needs Triton; {INSTALL_HINT}")
    if not (x.is_cuda or INTERPRETING) or x.ndim != 2 or x.dtype not in KERNEL_INPUT_DTYPES:
        raise ValueError(f"{where}{function} takes a 2D CUDA tensor of {KERNEL_INPUT_DTYPES}, "
                         f"got {x.dtype} {list(x.shape)} on {x.device}")
    if not (rows or columns):
        raise ValueError(f"{where}{function}: ask for rows, columns or both")
    return where


def _value_for_inf(dtype: torch.dtype) -> float:
    """TE's replacement for an infinite scale: the largest finite value of the input's dtype."""
    return float(torch.finfo(dtype).max)


# Every output buffer is passed to a launch once (only the never-touched placeholders of
# ``_unused`` may be passed several times), and codes are written as uint8 and viewed as E4M3
# after the launch. Compiled code does not trace these launches at all (the opaque ops at the end).
def _scales_1x128(operand_rows: int, reduction: int, device) -> torch.Tensor:
    """Uninitialized 1x128 decode scales of an operand [operand_rows, reduction] in GEMM layout:
    [rows, reduction/128] with strides (1, rows). Allocated as the transpose of a contiguous tensor:
    torch 2.11's functionalization of a Triton kernel's outputs lost the strides of an
    ``empty_strided`` buffer (the scaled-GEMM meta check then failed)."""
    return torch.empty(reduction // BLOCK, operand_rows, dtype=torch.float32, device=device).t()


def _scales_128x128(operand_rows: int, reduction: int, device) -> torch.Tensor:
    """Zeroed 128x128 decode scales of an operand [operand_rows, reduction] in GEMM layout:
    [L4, rows/128] with strides (1, L4), L4 = round_up(reduction/128, 4) (allocated as above)."""
    padded = round_up(reduction // BLOCK, 4)
    return torch.zeros(operand_rows // BLOCK, padded, dtype=torch.float32, device=device).t()


def _unused(device) -> Tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) for pointer arguments a launch never touches (its constexpr branch is compiled
    out): one-element buffers of their own, so that no output buffer doubles as a placeholder."""
    return torch.empty(1, dtype=torch.uint8, device=device), torch.empty(1, dtype=torch.float32, device=device)


def _block_outputs(num_rows: int, num_cols: int, tile_2d: bool, rows: bool, columns: bool, device):
    """fp8_block_quantize's uninitialized outputs for x [num_rows, num_cols]: (row codes [R, C] uint8,
    row scales, column codes [C, R] uint8, column scales), None where not asked; the fake
    implementation of ``block_quantize_op`` allocates the same."""
    make_scales = _scales_128x128 if tile_2d else _scales_1x128
    row_codes = torch.empty(num_rows, num_cols, dtype=torch.uint8, device=device) if rows else None
    row_scales = make_scales(num_rows, num_cols, device) if rows else None
    col_codes = torch.empty(num_cols, num_rows, dtype=torch.uint8, device=device) if columns else None
    col_scales = make_scales(num_cols, num_rows, device) if columns else None
    return row_codes, row_scales, col_codes, col_scales


def _as_e4m3(codes: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if codes is None else codes.view(torch.float8_e4m3fn)


def fp8_block_quantize(
    x: torch.Tensor,
    *,
    tile_2d: bool,
    rows: bool,
    columns: bool,
    rows_power_of_two: bool = True,
    columns_power_of_two: bool = True,
    name: Optional[str] = None,
    options: Fp8Options = FP8_OPTIONS,
) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Quantize x [R, C] (CUDA, bf16/fp16/fp32, any strides) to blockwise E4M3 (one or two reads of x).

    ``tile_2d=False``: ``rows`` gives x's 1x128 blocks along C, ``columns`` x^T's 1x128 blocks
    along R. ``tile_2d=True``: 128x128 tiles, ``rows`` for x and ``columns`` for x^T.
    Returns (row_codes [R, C], row_scales, column_codes [C, R], column_scales), None where not
    asked, scales in the GEMM layouts of the module docstring. C must divide by 128; R too, except
    for the rows-only 1D mode (tail rows are masked, nothing is padded).
    """
    where = _check_input(x, rows, columns, "fp8_block_quantize", name)
    num_rows, num_cols = x.shape
    if num_cols % BLOCK != 0:
        raise ValueError(f"{where}last dim {num_cols} is not a multiple of {BLOCK} (shape {list(x.shape)})")
    mask_rows = num_rows % BLOCK != 0
    if mask_rows and (tile_2d or columns):
        raise ValueError(f"{where}leading dim {num_rows} is not a multiple of {BLOCK} (shape {list(x.shape)}); "
                         f"128x128 tiles and the transposed orientation need it")
    row_codes, row_scales, col_codes, col_scales = _block_outputs(num_rows, num_cols, tile_2d, rows, columns,
                                                                  x.device)
    if rows:
        # 2D: storage [R/128, L4], tile (i, j) at i * L4 + j; 1D: storage [C/128, R], row r, block j
        # at j * R + r
        row_strides = (row_scales.stride(1), 1) if tile_2d else (1, num_rows)
    if columns:
        # 2D: storage [C/128, L4(R/128)], tile (i, j) of x is tile (j, i) of x^T, at j * L4 + i;
        # 1D: storage [R/128, C], column c, block i at i * C + c
        col_strides = (col_scales.stride(1), 1) if tile_2d else (1, num_cols)
    device = x.device
    unused_codes, unused_scales = _unused(device)
    row_args = (row_codes, row_scales, *row_strides) if rows else (unused_codes, unused_scales, 0, 0)
    col_args = (col_codes, col_scales, *col_strides) if columns else (unused_codes, unused_scales, 0, 0)
    _launch(x, row_args, col_args, (_value_for_inf(x.dtype), unused_scales, unused_scales), rows=rows,
            columns=columns, tile_2d=tile_2d, tensor_scale=False, rows_power_of_two=rows_power_of_two,
            columns_power_of_two=columns_power_of_two, options=options)
    return _as_e4m3(row_codes), row_scales, _as_e4m3(col_codes), col_scales


FLT_MAX = float(torch.finfo(torch.float32).max)


def _tensor_outputs(num_rows: int, num_cols: int, rows: bool, columns: bool, device):
    """fp8_tensor_quantize's uninitialized outputs: (row codes [R, C] uint8, column codes [C, R]
    uint8, None where not asked; the 0-dim fp32 decode scale, which the first program writes); the
    fake implementation of ``tensor_quantize_op`` allocates the same."""
    row_codes = torch.empty(num_rows, num_cols, dtype=torch.uint8, device=device) if rows else None
    col_codes = torch.empty(num_cols, num_rows, dtype=torch.uint8, device=device) if columns else None
    return row_codes, col_codes, torch.empty((), dtype=torch.float32, device=device)


def fp8_tensor_quantize(
    x: torch.Tensor, *, rows: bool, columns: bool, name: Optional[str] = None, options: Fp8Options = FP8_OPTIONS,
) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor], torch.Tensor]:
    """Quantize x [R, C] to per-tensor E4M3 (fp8_tensor): codes of x and/or x^T, and the decode scale.

    Torch's max-abs reduction for the amax, then the kernel writes ``rows`` (codes [R, C]) and/or
    ``columns`` (x^T's codes [C, R], contiguous, as the GEMM takes them); both asked, in a rows pass
    and a columns pass. Returns (row_codes, column_codes, decode scale 0-dim fp32), None where not
    asked. C must divide by 128; R too when ``columns`` (see ``supports_tensor_shape``).
    """
    where = _check_input(x, rows, columns, "fp8_tensor_quantize", name)
    if not supports_tensor_shape(x.shape, columns):
        raise ValueError(f"{where}fp8_tensor_quantize needs the last dim (and, for columns, the first) to divide "
                         f"by {BLOCK}, got {list(x.shape)}")
    num_rows, num_cols = x.shape
    device = x.device
    # max |x| is exact in any order and dtype; NaN propagates (the kernel reads it as +Inf).
    amax = torch.linalg.vector_norm(x, float("inf"), dtype=torch.float32).reshape(1)
    row_codes, col_codes, decode = _tensor_outputs(num_rows, num_cols, rows, columns, device)
    unused_codes, unused_scales = _unused(device)
    _launch(x, (row_codes if rows else unused_codes, unused_scales, 0, 0),
            (col_codes if columns else unused_codes, unused_scales, 0, 0), (FLT_MAX, amax, decode),
            rows=rows, columns=columns, tile_2d=False, tensor_scale=True, rows_power_of_two=False,
            columns_power_of_two=False, options=options)
    return _as_e4m3(row_codes), _as_e4m3(col_codes), decode


def supports_tensor_shape(shape, columns: bool) -> bool:
    """Whether fp8_tensor_quantize takes a tensor of this shape (else the torch reference runs)."""
    return shape[0] > 0 and shape[1] % BLOCK == 0 and (not columns or shape[0] % BLOCK == 0)


# ----------------------------------------------------------------------------------------------
# Opaque ops for torch.compile
#
# Traced by Dynamo, the kernels above become Triton launches that mutate their fresh output
# buffers, and torch 2.11's Inductor failed on whole FP8 blocks built that way: a self-copy of a
# mutated buffer and then KeyError in Scheduler.compute_ancestors (pytorch/pytorch#189271, fixed
# after 2.11). As custom ops that return new tensors there is no
# mutation in the graph. Only compiled code calls them (eager skips the op dispatch, as the FP8 GEMM
# does); the fake implementations allocate exactly what the kernels return, so the strides the
# compiled graph assumes are the real ones.


def _present(tensor: Optional[torch.Tensor], device) -> torch.Tensor:
    """An op's output that was not asked for: an empty tensor (custom ops return no None)."""
    return torch.empty(0, dtype=torch.uint8, device=device) if tensor is None else tensor


def _optional(tensor: torch.Tensor, asked: bool) -> Optional[torch.Tensor]:
    return tensor if asked else None


@torch.library.custom_op("hybrid_quant::fp8_block_quantize", mutates_args=())
def _block_quantize_op(x: torch.Tensor, tile_2d: bool, rows: bool, columns: bool, rows_power_of_two: bool,
                       columns_power_of_two: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    outputs = fp8_block_quantize(x, tile_2d=tile_2d, rows=rows, columns=columns, rows_power_of_two=rows_power_of_two,
                                 columns_power_of_two=columns_power_of_two, name="<compiled layer>")
    return tuple(_present(t, x.device) for t in outputs)


@_block_quantize_op.register_fake
def _block_quantize_fake(x, tile_2d, rows, columns, rows_power_of_two, columns_power_of_two):
    row_codes, row_scales, col_codes, col_scales = _block_outputs(x.shape[0], x.shape[1], tile_2d, rows, columns,
                                                                  x.device)
    return _present(_as_e4m3(row_codes), x.device), _present(row_scales, x.device), \
        _present(_as_e4m3(col_codes), x.device), _present(col_scales, x.device)


def block_quantize_op(x: torch.Tensor, *, tile_2d: bool, rows: bool, columns: bool, rows_power_of_two: bool = True,
                      columns_power_of_two: bool = True):
    """``fp8_block_quantize`` (default kernel settings) as one opaque op for compiled code."""
    row_codes, row_scales, col_codes, col_scales = _block_quantize_op(x, tile_2d, rows, columns, rows_power_of_two,
                                                                      columns_power_of_two)
    return (_optional(row_codes, rows), _optional(row_scales, rows), _optional(col_codes, columns),
            _optional(col_scales, columns))


@torch.library.custom_op("hybrid_quant::fp8_tensor_quantize", mutates_args=())
def _tensor_quantize_op(x: torch.Tensor, rows: bool, columns: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    row_codes, col_codes, decode = fp8_tensor_quantize(x, rows=rows, columns=columns, name="<compiled layer>")
    return _present(row_codes, x.device), _present(col_codes, x.device), decode


@_tensor_quantize_op.register_fake
def _tensor_quantize_fake(x, rows, columns):
    row_codes, col_codes, decode = _tensor_outputs(x.shape[0], x.shape[1], rows, columns, x.device)
    return _present(_as_e4m3(row_codes), x.device), _present(_as_e4m3(col_codes), x.device), decode


def tensor_quantize_op(x: torch.Tensor, *, rows: bool, columns: bool):
    """``fp8_tensor_quantize`` (default kernel settings) as one opaque op for compiled code."""
    row_codes, col_codes, decode = _tensor_quantize_op(x, rows, columns)
    return _optional(row_codes, rows), _optional(col_codes, columns), decode


def block_quantize(x: torch.Tensor, *, tile_2d: bool, rows: bool, columns: bool, rows_power_of_two: bool = True,
                   columns_power_of_two: bool = True, name: Optional[str] = None):
    """``fp8_block_quantize`` with default kernel settings: the opaque op while torch.compile traces,
    the kernel itself in eager code (no op dispatch)."""
    if torch.compiler.is_compiling():
        return block_quantize_op(x, tile_2d=tile_2d, rows=rows, columns=columns, rows_power_of_two=rows_power_of_two,
                                 columns_power_of_two=columns_power_of_two)
    return fp8_block_quantize(x, tile_2d=tile_2d, rows=rows, columns=columns, rows_power_of_two=rows_power_of_two,
                              columns_power_of_two=columns_power_of_two, name=name)


def tensor_quantize(x: torch.Tensor, *, rows: bool, columns: bool, name: Optional[str] = None):
    """``fp8_tensor_quantize`` with default kernel settings: the opaque op while torch.compile traces,
    the kernel itself in eager code."""
    if torch.compiler.is_compiling():
        return tensor_quantize_op(x, rows=rows, columns=columns)
    return fp8_tensor_quantize(x, rows=rows, columns=columns, name=name)
