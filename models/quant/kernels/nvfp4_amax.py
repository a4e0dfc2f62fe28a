"""NVFP4's per-tensor scales: the amax passes that come before the quantize kernels (kernels.nvfp4).

NVFP4 scales every tensor by S_enc = 2688 / max |x| (1536 / max |x| with Four Over Six, 688128 / max |x|
with UE5M3 block scales; TE's order, ``tensor_scales`` below), so each quantize call first reads the
whole operand:
- without the RHT, ``tensor_amax``: chunks of 16K elements (more beyond 2^26 elements) per program,
  one atomic max each into a zeroed fp32; the quantize kernels derive [S_enc, S_dec] from it
  themselves (no finalize launch);
- with the RHT (Wgrad's operands along tokens), ``rht_global_scales``: a persistent kernel writes
  per-program maxima of the transformed values, a one-program finalize reduces them to
  [S_enc, S_dec];
- an operand quantized along rows (1x16) and along columns with the RHT (X: Fprop and Wgrad; dY:
  Dgrad and Wgrad), ``rows_and_rht_columns_scales``: the RHT pass also keeps max |x| of the values
  it loaded, so one read gives both orientations' scales.
A max is exact in any order; NaN and Inf come out as Inf, which ``tensor_scales`` turns into a
NaN decode scale (the reference's non-finite rule).

The torch references: ``tensor_amax_ref`` and ``rht_global_scales_ref`` below.
"""

from __future__ import annotations

from typing import Optional

import torch

from models.quant.formats.four_over_six import FOUR_OVER_SIX_BOUND
from models.quant.formats.nvfp4 import SCALE_BOUNDS, nvfp4_global_scales
from models.quant.kernels.fp4_common import KERNEL_INPUT_DTYPES
from models.quant.kernels.options import NVFP4_OPTIONS, Nvfp4Options
from models.quant.kernels.triton_common import bf16_rounding_mode, check_input, tl, triton
from models.quant.rht import rht

MAX_PARTIALS = 4096
"""At most this many programs in the persistent RHT amax pass (the finalize reduces them in one)."""


def tensor_amax_ref(x: torch.Tensor) -> torch.Tensor:
    """max |x| as an fp32 [1] (NaN and Inf as Inf, as the Triton pass gives them)."""
    amax = x.float().abs().amax().reshape(1)
    return torch.where(amax.isnan(), torch.full_like(amax, float("inf")), amax)


def rht_global_scales_ref(x: torch.Tensor, four_over_six: bool = False, fmt: str = "nvfp4") -> torch.Tensor:
    """[S_enc, S_dec] of ``rht(x.t())``, the scales of ``formats.quantize(rht(x.t()), fmt)`` (with
    ``four_over_six``: of Four Over Six, whose bound is 256)."""
    bound = FOUR_OVER_SIX_BOUND if four_over_six else SCALE_BOUNDS[fmt]
    return torch.stack(nvfp4_global_scales(rht(x.t()).float().abs().amax(), bound))


if triton is not None:
    # Imported under their own names: Inductor splices each jit helper's source under its __name__.
    from models.quant.kernels.fp4_common import load_16_rows, max_abs_16, rht16
    from models.quant.kernels.triton_common import abs_nan_to_inf, nan_fp32

    @triton.jit
    def tensor_scales(amax, FOUR_OVER_SIX: tl.constexpr, UE5M3: tl.constexpr):
        """(S_enc, S_dec) of the tensor's fp32 amax >= 0 (+Inf for NaN/Inf), TE's order:
        S_enc = min(2688 / amax, FLT_MAX); 1 if amax == 0 or S_enc == 0; NaN if amax is not finite.
        (Literals: 2688 = 448 * 6; 1536 = 256 * 6, Four Over Six's bound (FOUR_OVER_SIX != 0);
        688128 = 114688 * 6, UE5M3's largest scale (UE5M3); 3.4028234663852886e38 = FLT_MAX.)"""
        if FOUR_OVER_SIX != 0:
            encode = tl.math.div_rn(tl.full([], 1536.0, tl.float32), amax)
        elif UE5M3:
            encode = tl.math.div_rn(tl.full([], 688128.0, tl.float32), amax)
        else:
            encode = tl.math.div_rn(tl.full([], 2688.0, tl.float32), amax)
        encode = tl.where(encode > 3.4028234663852886e38, 3.4028234663852886e38, encode)
        encode = tl.where((amax == 0.0) | (encode == 0.0), 1.0, encode)
        encode = tl.where(amax <= 3.4028234663852886e38, encode, nan_fp32())
        decode = tl.math.div_rn(tl.full([], 1.0, tl.float32), encode)
        return encode, decode

    @triton.jit
    def _finalize_scales_kernel(partials_ptr, num_partials, global_ptr, PARTIALS_POW2: tl.constexpr,
                                PLAIN_AMAX: tl.constexpr, FOUR_OVER_SIX: tl.constexpr, UE5M3: tl.constexpr):
        """One program: tensor amax from the fp32 partials -> global_ptr = [S_enc, S_dec, (max |x|), amax].
        PLAIN_AMAX: partials_ptr[num_partials:2 num_partials] hold max |x| too (the untransformed
        values), reduced into global_ptr[2]. global_ptr[3]: the transformed tensor's amax, which Four
        Over Six's candidate errors take (FOUR_OVER_SIX: S_enc from the bound 256; UE5M3: from 114688)."""
        index = tl.arange(0, PARTIALS_POW2)
        partials = tl.load(partials_ptr + index, mask=index < num_partials, other=0.0).to(tl.float32)
        amax = tl.max(abs_nan_to_inf(partials), axis=0)
        encode, decode = tensor_scales(amax, FOUR_OVER_SIX, UE5M3)
        tl.store(global_ptr, encode)
        tl.store(global_ptr + 1, decode)
        tl.store(global_ptr + 3, amax)
        if PLAIN_AMAX:
            plain = tl.load(partials_ptr + num_partials + index, mask=index < num_partials, other=0.0)
            tl.store(global_ptr + 2, tl.max(abs_nan_to_inf(plain), axis=0))

    @triton.jit
    def _amax_chunks_kernel(x_ptr, amax_ptr, numel, per_program, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
        """amax_ptr[0] = max(amax_ptr[0], max |x| (NaN -> Inf) over the flat chunk [pid * per_program,
        +per_program)), by one atomic max per program (amax_ptr starts at 0; values are >= 0).

        per_program is a multiple of BLOCK * UNROLL; the UNROLL loads of a step are independent, so
        they are all in flight before the max: a persistent loop with one load per step read x at
        ~40% of copy bandwidth on the H200, this at ~96%."""
        pid = tl.program_id(0)
        start = pid.to(tl.int64) * per_program
        accumulator = tl.zeros([BLOCK], dtype=tl.float32)
        for step in range(0, per_program, BLOCK * UNROLL):
            for unrolled in tl.static_range(UNROLL):
                offsets = start + step + unrolled * BLOCK + tl.arange(0, BLOCK)
                x = tl.load(x_ptr + offsets, mask=offsets < numel, other=0.0).to(tl.float32)
                accumulator = tl.maximum(accumulator, abs_nan_to_inf(x))
        tl.atomic_max(amax_ptr, tl.max(accumulator, axis=0))

    @triton.jit
    def _amax_columns_rht_kernel(
        x_ptr,
        partials_ptr,
        groups,
        cols,
        num_tiles_c,
        num_tiles,
        num_programs,
        GROUPS: tl.constexpr,
        BLOCK_C: tl.constexpr,
        ROUND_BF16: tl.constexpr,  # 0: none (fp32 input), 1: integer RNE, 2: hardware RNE
        PLAIN_AMAX: tl.constexpr,
    ):
        """Persistent: partial max |rht along dim 0 (x)| over 16-row groups, into partials[pid]; with
        PLAIN_AMAX also max |x| of the same loads (before the transform) into partials[num_programs + pid],
        so one read of x gives the global scales of both its orientations."""
        pid = tl.program_id(0)
        accumulator = tl.zeros([GROUPS, BLOCK_C], dtype=tl.float32)
        plain_accumulator = tl.zeros([GROUPS, BLOCK_C], dtype=tl.float32)
        for step in range(0, tl.cdiv(num_tiles, num_programs)):
            tile = pid + step * num_programs  # tiles past the end load nothing (masked)
            group = (tile // num_tiles_c) * GROUPS + tl.arange(0, GROUPS)
            col = (tile % num_tiles_c) * BLOCK_C + tl.arange(0, BLOCK_C)
            mask = (group < groups)[:, None] & (col < cols)[None, :] & (tile < num_tiles)
            base = x_ptr + (group.to(tl.int64) * 16)[:, None] * cols + col[None, :]
            x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15 = load_16_rows(base, cols, mask)
            if PLAIN_AMAX:
                plain = max_abs_16(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
                                   NAN_TO_INF=True)
                plain_accumulator = tl.maximum(plain_accumulator, plain)
            x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15 = rht16(
                x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, ROUND_BF16
            )
            block = max_abs_16(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, NAN_TO_INF=True)
            accumulator = tl.maximum(accumulator, block)
        tl.store(partials_ptr + pid, tl.max(tl.max(accumulator, axis=1), axis=0))
        if PLAIN_AMAX:
            tl.store(partials_ptr + num_programs + pid, tl.max(tl.max(plain_accumulator, axis=1), axis=0))


def ue5m3_scales(fmt: str) -> bool:
    """The kernels' UE5M3 constexpr: whether element format ``fmt`` (nvfp4, nvfp4_ue5m3) has UE5M3
    block scales; ValueError for a format these kernels do not quantize."""
    if fmt not in SCALE_BOUNDS:
        raise ValueError(f"the NVFP4 kernels quantize {sorted(SCALE_BOUNDS)}, not {fmt!r}")
    return fmt == "nvfp4_ue5m3"


def _amax_programs(x: torch.Tensor, num_tiles: int, options: Nvfp4Options) -> int:
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 2
    return max(1, min(num_tiles, options.amax_programs_per_sm * sms, MAX_PARTIALS))


def tensor_amax(x: torch.Tensor, *, options: Nvfp4Options = NVFP4_OPTIONS) -> torch.Tensor:
    """max |x| as an fp32 [1] (``tensor_amax_ref``), one Triton pass over contiguous x."""
    block, unroll, warps = options.amax_chunk
    numel = x.numel()
    step = block * unroll
    per_program = step * triton.cdiv(numel, step * options.amax_max_programs)
    amax = torch.zeros(1, dtype=torch.float32, device=x.device)
    _amax_chunks_kernel[(triton.cdiv(numel, per_program),)](
        x, amax, numel, per_program, BLOCK=block, UNROLL=unroll, num_warps=warps, enable_fp_fusion=False,
    )
    return amax


def rht_global_scales(x: torch.Tensor, *, plain_amax: bool = False, four_over_six: bool = False,
                      fmt: str = "nvfp4", options: Nvfp4Options = NVFP4_OPTIONS) -> torch.Tensor:
    """[S_enc, S_dec, max |x| (plain_amax) or unset, amax] (fp32, on x's device) from amax = max |rht along
    dim 0 (x)| (``rht_global_scales_ref``): the persistent RHT amax pass, then a one-program finalize.
    ``four_over_six``: S_enc = 1536 / amax (Four Over Six's bound 256) instead of 2688 / amax;
    ``fmt`` "nvfp4_ue5m3": 688128 / amax (UE5M3's largest scale, 114688).

    ``plain_amax``: [S_enc, S_dec, max |x|] from the same read, the third element being what
    ``tensor_amax(x)`` returns. An operand quantized both along rows (1x16, no RHT) and along columns
    with the RHT passes element 2 as the rows call's ``amax`` and the tensor as the columns call's
    ``global_scales``: three reads of x for its two orientations instead of four."""
    x = x.contiguous()
    rows, cols = x.shape
    rht_groups, rht_cols, warps = options.rht_amax_launch(x.dtype, plain_amax)
    groups = rows // 16
    tiles_c = triton.cdiv(cols, rht_cols)
    num_tiles = triton.cdiv(groups, rht_groups) * tiles_c
    programs = _amax_programs(x, num_tiles, options)
    partials = torch.empty(2 * programs if plain_amax else programs, dtype=torch.float32, device=x.device)
    _amax_columns_rht_kernel[(programs,)](
        x, partials, groups, cols, tiles_c, num_tiles, programs, GROUPS=rht_groups, BLOCK_C=rht_cols,
        ROUND_BF16=bf16_rounding_mode(x, options.bf16_rounding), PLAIN_AMAX=plain_amax, num_warps=warps,
        enable_fp_fusion=False,
    )
    global_scales = torch.empty(4, dtype=torch.float32, device=x.device)
    _finalize_scales_kernel[(1,)](
        partials, programs, global_scales, PARTIALS_POW2=max(32, triton.next_power_of_2(programs)),
        PLAIN_AMAX=plain_amax, FOUR_OVER_SIX=four_over_six, UE5M3=ue5m3_scales(fmt), num_warps=4,
        enable_fp_fusion=False,
    )
    return global_scales


def global_scales_from_amax(amax: torch.Tensor, *, four_over_six: bool = False, fmt: str = "nvfp4") -> torch.Tensor:
    """[S_enc, S_dec, unset, amax] (fp32 [4]) from an fp32 [1] amax already taken (a tensor-parallel group's):
    ``rht_global_scales``' finalize launch on that one value, so the scales are the ones the kernels derive
    from the whole tensor's amax, bit for bit."""
    global_scales = torch.empty(4, dtype=torch.float32, device=amax.device)
    _finalize_scales_kernel[(1,)](
        amax.float().contiguous(), 1, global_scales, PARTIALS_POW2=32, PLAIN_AMAX=False, FOUR_OVER_SIX=four_over_six,
        UE5M3=ue5m3_scales(fmt), num_warps=4, enable_fp_fusion=False,
    )
    return global_scales


def rows_and_rht_columns_scales(x: torch.Tensor, *, name: Optional[str] = None, four_over_six: bool = False,
                                fmt: str = "nvfp4", options: Nvfp4Options = NVFP4_OPTIONS) -> torch.Tensor:
    """``rht_global_scales(x, plain_amax=True)`` with the input checks: [S_enc, S_dec] of the RHT
    columns orientation and max |x| for the rows orientation, from one read of x (rows % 16 == 0).
    ``four_over_six``: the columns orientation's S_enc is Four Over Six's."""
    check_input(x, dtypes=KERNEL_INPUT_DTYPES, cols_multiple=16, rows_multiple=16,
                what="rows_and_rht_columns_scales", name=name)
    return rht_global_scales(x, plain_amax=True, four_over_six=four_over_six, fmt=fmt, options=options)
