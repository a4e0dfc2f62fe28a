"""Triton kernels for NVFP4 quantize-dequantize: the emulated GEMM operands, fused.

What they compute is exactly ``models.quant.formats.quantize(..., "nvfp4")`` (TE's fp32 op order,
see that module's docstring) followed by ``scaled_values()``; ``models.quant.rht.rht`` first for the
RHT variant. Bit-identical to that torch reference for round-to-nearest (element codes, E4M3 block
scales, scaled values, per-tensor decode scale); stochastic rounding uses Triton's Philox
instead of torch's generator, so it matches in distribution, not in draws. One Philox call
(``tl.randint4x``, counter = the offset of the block's first element) gives the random bits of one
16-element block, 8 per element, as TE's ``cvt.rs.satfinite.e2m1x4.f32`` consumes one 32-bit word
per four values (SR_BITS; 32 bits per element, one call per four, is the alternative). The uniform
of a byte b is (b + 1/2) / 256, so P(round up) is the exact probability rounded to a multiple of
1/256: E[q] is within 1/512 of a grid step of x.

Orientations (x is a contiguous 2D [rows, cols] CUDA tensor, bf16 or fp32):
- ``nvfp4_quantize_rows(x)``: 1x16 blocks along the last dim (X for Fprop, dY for Dgrad).
- ``nvfp4_quantize_rows(x, two_d=True)``: one scale per 16x16 tile (W).
- ``nvfp4_quantize_columns(x, rht=...)``: 16x1 blocks along dim 0, i.e. ``quantize(rht(x.t()))``
  for Wgrad's operands quantized along tokens, written back in x's own [rows, cols] layout
  (scales [rows / 16, cols]) so that no transpose is materialized.

Launches: the amax pass, then the quantize pass. Without RHT the amax pass is one Triton kernel
reading x at near copy speed after a zero-fill (``tensor_amax``: 16K-element chunks, an atomic max
into the zeroed fp32; or torch's reduction, see AMAX_REDUCTION), and each quantize program derives
[S_enc, S_dec] from it; with RHT a persistent kernel writes per-program partial maxima of the transformed values and a
one-program finalize reduces them to [S_enc, S_dec]. The quantize pass walks its tiles from the
last (REVERSED_QUANTIZE_PASS), so it starts on what the amax pass left in L2, and does, per tile:
block amax, E4M3 scale, reciprocal, scaling, E2M1 rounding (RNE or stochastic, by the bits of the
value, see ``_round_e2m1``), outputs. NaN/Inf anywhere turns the tensor amax into Inf, and a
non-finite amax gives a NaN decode scale, as in the reference.

Exactness notes (why the code looks the way it does):
- every fp32 division is ``tl.math.div_rn`` (Triton's ``/`` may lower to an approximate divide);
- every launch passes ``enable_fp_fusion=False``, so no multiply-add is contracted into an FMA;
- E4M3 rounding of the block scale is done arithmetically, (v + C) - C with C = 2^(e+20) (or 2^14
  in the subnormal range), which rounds v to 3 mantissa bits with RNE, instead of relying on the
  fp8 cast of the backend; the code bits are assembled from the rounded value;
- the RHT output is rounded to bf16 by the integer RNE trick, identical to ``tensor.to(bfloat16)``;
- NaN-sensitive min/max use ``tl.where`` (``tl.minimum`` drops NaN by default).

The switch: ``use_triton(False)`` (or env ``MODELS_QUANT_TRITON=0``) makes ``enabled()`` False and
``models.quant.linear`` falls back to the torch reference. Without Triton this module imports fine
and ``has_triton()`` is False.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from models.quant.triton_common import (  # noqa: F401 - has_triton, use_triton, INSTALL_HINT: kernels' API
    INSTALL_HINT,
    INTERPRETING,
    enabled,
    has_triton,
    require_triton,
    tl,
    triton,
    use_triton,
)

KERNEL_INPUT_DTYPES = (torch.bfloat16, torch.float32)


def supports(x: torch.Tensor) -> bool:
    """Whether the kernels can take ``x`` (switched on, Triton present, CUDA, bf16/fp32, 2D)."""
    return enabled() and x.is_cuda and x.dtype in KERNEL_INPUT_DTYPES and x.ndim == 2


@dataclass
class KernelQuantized:
    """Output of a kernel, in the input's [rows, cols] layout.

    values: q * s_b (scaled values, without the per-tensor decode scale), ``out_dtype``.
    block_scales: float8_e4m3fn; rows: [rows, cols/16]; two_d: [rows/16, cols/16];
        columns: [rows/16, cols].
    decode_scale: fp32 [1], 1/S_enc (NaN if the input had NaN/Inf).
    codes: uint8 E2M1 codes [rows, cols] (bit 3 sign), or None when not asked for.
    """

    values: torch.Tensor
    block_scales: torch.Tensor
    decode_scale: torch.Tensor
    codes: Optional[torch.Tensor]


# Constants inside the kernels are literals (Triton reads no plain module globals): 2688 = 448 * 6,
# 0.16666666666666666 = 1/6 (becomes fp32(1/6), TE's constexpr 1.0f / 6.0f),
# 3.4028234663852886e38 = FLT_MAX, 0.015625 = 2^-6 (smallest normal E4M3).

if triton is not None:
    # Imported under their own names: Inductor compiles a kernel called inside torch.compile by
    # splicing the source of every jit helper it calls, which defines the helper under its
    # __name__; an alias would leave the kernel calling an undefined name.
    from models.quant.triton_common import abs_nan_to_inf, e4m3_round, nan_fp32

    @triton.jit
    def _round_to_bf16(y, HARDWARE: tl.constexpr):
        """fp32 -> nearest bf16 (ties to even), returned as fp32; NaN stays NaN. By integer arithmetic
        on the bits, or (HARDWARE) by the backend's fp32 -> bf16 conversion (cvt.rn.bf16.f32 on CUDA:
        RNE by PTX's definition, subnormals kept), which Triton's interpreter truncates instead."""
        if HARDWARE:
            return y.to(tl.bfloat16).to(tl.float32)
        bits = y.to(tl.int32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        return tl.where(y == y, rounded.to(tl.float32, bitcast=True), y)

    @triton.jit
    def _rht16(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, ROUND_BF16: tl.constexpr):
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
            x0 = _round_to_bf16(x0, hardware)
            x1 = _round_to_bf16(x1, hardware)
            x2 = _round_to_bf16(x2, hardware)
            x3 = _round_to_bf16(x3, hardware)
            x4 = _round_to_bf16(x4, hardware)
            x5 = _round_to_bf16(x5, hardware)
            x6 = _round_to_bf16(x6, hardware)
            x7 = _round_to_bf16(x7, hardware)
            x8 = _round_to_bf16(x8, hardware)
            x9 = _round_to_bf16(x9, hardware)
            x10 = _round_to_bf16(x10, hardware)
            x11 = _round_to_bf16(x11, hardware)
            x12 = _round_to_bf16(x12, hardware)
            x13 = _round_to_bf16(x13, hardware)
            x14 = _round_to_bf16(x14, hardware)
            x15 = _round_to_bf16(x15, hardware)
        return x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15

    @triton.jit
    def _finalize_scales_kernel(partials_ptr, num_partials, global_ptr, PARTIALS_POW2: tl.constexpr,
                                PLAIN_AMAX: tl.constexpr):
        """One program: tensor amax from the fp32 partials -> global_ptr = [S_enc, S_dec], TE's order.

        S_enc = min(2688 / amax, FLT_MAX); 1 if amax == 0 or S_enc == 0; NaN if amax is not finite.
        PLAIN_AMAX: partials_ptr[num_partials:2 num_partials] hold max |x| too (the untransformed
        values), reduced into global_ptr[2].
        """
        index = tl.arange(0, PARTIALS_POW2)
        # NaN -> Inf before the max (tl.max may drop a NaN): a torch-reduced amax can be NaN.
        partials = tl.load(partials_ptr + index, mask=index < num_partials, other=0.0).to(tl.float32)
        encode, decode = _global_scales(tl.max(abs_nan_to_inf(partials), axis=0))
        tl.store(global_ptr, encode)
        tl.store(global_ptr + 1, decode)
        if PLAIN_AMAX:
            plain = tl.load(partials_ptr + num_partials + index, mask=index < num_partials, other=0.0)
            tl.store(global_ptr + 2, tl.max(abs_nan_to_inf(plain), axis=0))

    @triton.jit
    def _global_scales(amax):
        """(S_enc, S_dec) of the tensor's fp32 amax >= 0 (+Inf for NaN/Inf), TE's order:
        S_enc = min(2688 / amax, FLT_MAX); 1 if amax == 0 or S_enc == 0; NaN if amax is not finite."""
        encode = tl.math.div_rn(tl.full([], 2688.0, tl.float32), amax)
        encode = tl.where(encode > 3.4028234663852886e38, 3.4028234663852886e38, encode)
        encode = tl.where((amax == 0.0) | (encode == 0.0), 1.0, encode)
        encode = tl.where(amax <= 3.4028234663852886e38, encode, nan_fp32())
        decode = tl.math.div_rn(tl.full([], 1.0, tl.float32), encode)
        return encode, decode

    @triton.jit
    def _load_global_scales(global_ptr, amax_ptr, first_program, SCALES_FROM_AMAX: tl.constexpr):
        """(S_enc, S_dec): from the finalize kernel's output, or (SCALES_FROM_AMAX) computed here from
        the tensor's amax (one value: fp32 from the Triton pass, x's dtype from torch's), the first
        program writing them to global_ptr for the GEMM. Every program computes the same two
        numbers."""
        if SCALES_FROM_AMAX:
            encode, decode = _global_scales(abs_nan_to_inf(tl.load(amax_ptr).to(tl.float32)))
            if first_program:
                tl.store(global_ptr, encode)
                tl.store(global_ptr + 1, decode)
        else:
            encode = tl.load(global_ptr)
            decode = tl.load(global_ptr + 1)
        return encode, decode

    @triton.jit
    def _e4m3_scale(value):
        """E4M3 RNE of value >= 0 (or NaN), saturating at 448: (fp32 value, uint8 code)."""
        rounded, code = e4m3_round(value)
        return rounded, code.to(tl.uint8)

    @triton.jit
    def _block_reciprocal(scale, decode):
        """r_b = min(1 / (s_b * S_dec), FLT_MAX); NaN stays NaN."""
        reciprocal = tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale * decode)
        return tl.where(reciprocal > 3.4028234663852886e38, 3.4028234663852886e38, reciprocal)

    @triton.jit
    def _round_e2m1(scaled, uniform, STOCHASTIC: tl.constexpr):
        """E2M1 of fp32 scaled (already times r_b): (grid value with sign as fp32, uint8 code).

        By the bits of |scaled| (clamped to 6), not by comparing with the grid: E2M1 values are the
        fp32 values with one mantissa bit and spacing 0.5 below 1, so with e = max(exponent, 0) the
        spacing is 2^(e-1), and
        - RNE: (m + 2^(e+22)) - 2^(e+22), whose fp32 addition rounds m to a multiple of 2^(e-1) with
          ties to even (the even grid neighbour: the tie 0.25 -> 0, 0.75 -> 1, 2.5 -> 2, 5 -> 4);
        - SR: lower = m truncated to one mantissa bit (to a multiple of 0.5 below 1), then
          lower + 2^(e-1) if uniform * 2^(e-1) < m - lower (both sides exact), so
          P(up) = (m - lower) / spacing.
        The kernels are issue-bound: at 16 x 128 x 4 the rows kernel compiles to 624 SASS
        instructions this way against 976 with a comparison ladder (m > 0.25, m >= 0.75, ...), and
        ran 32% faster (run X).
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
    def _load_16_rows(base, cols, mask):
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
    def _magnitude(x, NAN_TO_INF: tl.constexpr):
        """|x|, with NaN -> +Inf if NAN_TO_INF (so a max never drops it)."""
        if NAN_TO_INF:
            magnitude = abs_nan_to_inf(x)
        else:
            magnitude = tl.abs(x)
        return magnitude

    @triton.jit
    def _max_abs_16(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, NAN_TO_INF: tl.constexpr):
        """Elementwise max |x_j| over the 16 tensors (NaN -> Inf first if NAN_TO_INF)."""
        block = tl.maximum(_magnitude(x0, NAN_TO_INF), _magnitude(x1, NAN_TO_INF))
        block = tl.maximum(block, _magnitude(x2, NAN_TO_INF))
        block = tl.maximum(block, _magnitude(x3, NAN_TO_INF))
        block = tl.maximum(block, _magnitude(x4, NAN_TO_INF))
        block = tl.maximum(block, _magnitude(x5, NAN_TO_INF))
        block = tl.maximum(block, _magnitude(x6, NAN_TO_INF))
        block = tl.maximum(block, _magnitude(x7, NAN_TO_INF))
        block = tl.maximum(block, _magnitude(x8, NAN_TO_INF))
        block = tl.maximum(block, _magnitude(x9, NAN_TO_INF))
        block = tl.maximum(block, _magnitude(x10, NAN_TO_INF))
        block = tl.maximum(block, _magnitude(x11, NAN_TO_INF))
        block = tl.maximum(block, _magnitude(x12, NAN_TO_INF))
        block = tl.maximum(block, _magnitude(x13, NAN_TO_INF))
        block = tl.maximum(block, _magnitude(x14, NAN_TO_INF))
        block = tl.maximum(block, _magnitude(x15, NAN_TO_INF))
        return block

    @triton.jit
    def _tile_of_program(num_tiles_c, REVERSED: tl.constexpr):
        """(tile row, tile col) of this program in a 1D row-major grid over the tiles. REVERSED walks
        the tiles from the last: the amax pass reads x front to back, so its tail is still in L2 when
        the quantize pass starts there."""
        pid = tl.program_id(0)
        if REVERSED:
            pid = tl.num_programs(0) - 1 - pid
        return pid // num_tiles_c, pid % num_tiles_c

    @triton.jit
    def _uniform_from_byte(byte):
        """(byte + 1/2) / 256 for an integer byte in [0, 256): a uniform with 8 random bits, the
        midpoint of its 1/256 bin (so P(round up) = ceil(256 f - 1/2) / 256, within 1/512 of f)."""
        return (byte.to(tl.float32) + 0.5) * 0.00390625

    @triton.jit
    def _amax_chunks_kernel(x_ptr, amax_ptr, numel, per_program, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
        """amax_ptr[0] = max(amax_ptr[0], max |x| (NaN -> Inf) over the flat chunk [pid * per_program,
        +per_program)), by one atomic max per program (amax_ptr starts at 0; values are >= 0).

        per_program is a multiple of BLOCK * UNROLL; the UNROLL loads of a step are independent, so
        they are all in flight before the max. A persistent loop with one load per step read x at
        ~40% of copy bandwidth on the H200; this reads it at ~96% (8192 x 20480 bf16)."""
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
        ROUND_BF16: tl.constexpr,  # 0: none (fp32 input), 1: integer RNE, 2: hardware RNE (BF16_ROUNDING)
        PLAIN_AMAX: tl.constexpr,
    ):
        """Persistent: partial max |rht along dim 0 (x)| over 16-row groups, into partials[pid]; with
        PLAIN_AMAX also max |x| of the same loads (before the transform) into partials[num_programs + pid],
        so one read of x gives the global scales of both its orientations (X for Fprop and Wgrad)."""
        pid = tl.program_id(0)
        accumulator = tl.zeros([GROUPS, BLOCK_C], dtype=tl.float32)
        plain_accumulator = tl.zeros([GROUPS, BLOCK_C], dtype=tl.float32)
        for step in range(0, tl.cdiv(num_tiles, num_programs)):
            tile = pid + step * num_programs  # tiles past the end load nothing (masked)
            group = (tile // num_tiles_c) * GROUPS + tl.arange(0, GROUPS)
            col = (tile % num_tiles_c) * BLOCK_C + tl.arange(0, BLOCK_C)
            mask = (group < groups)[:, None] & (col < cols)[None, :] & (tile < num_tiles)
            base = x_ptr + (group.to(tl.int64) * 16)[:, None] * cols + col[None, :]
            x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15 = _load_16_rows(base, cols, mask)
            if PLAIN_AMAX:
                plain = _max_abs_16(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15,
                                    NAN_TO_INF=True)
                plain_accumulator = tl.maximum(plain_accumulator, plain)
            x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15 = _rht16(
                x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, ROUND_BF16
            )
            block = _max_abs_16(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, NAN_TO_INF=True)
            accumulator = tl.maximum(accumulator, block)
        tl.store(partials_ptr + pid, tl.max(tl.max(accumulator, axis=1), axis=0))
        if PLAIN_AMAX:
            tl.store(partials_ptr + num_programs + pid, tl.max(tl.max(plain_accumulator, axis=1), axis=0))

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
        REVERSED: tl.constexpr,
        SR_BITS: tl.constexpr,
    ):
        """One [BLOCK_R, BLOCK_C] tile: 1x16 blocks along cols, or (TWO_D, BLOCK_R == 16) 16x16 tiles."""
        pid_r, pid_c = _tile_of_program(tl.cdiv(cols, BLOCK_C), REVERSED)
        encode, decode = _load_global_scales(global_ptr, amax_ptr, (pid_r == 0) & (pid_c == 0), SCALES_FROM_AMAX)
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
            # axis 0, but reducing block_amax led Triton 3.6 to a register layout that holds the
            # whole tile in every thread of every warp (255 registers, spilled; 6-7x slower, run Y).
            column_amax = tl.max(tl.abs(x), axis=0)  # [BLOCK_C]: rows pid_r*16 .. +16
            tile_amax = tl.max(tl.reshape(column_amax, [BLOCK_C // 16, 16]), axis=1)  # [BLOCK_C / 16]
            tile_scale, tile_code = _e4m3_scale(tile_amax * (encode * 0.16666666666666666))
            tl.store(scales_ptr + pid_r * scale_cols + scale_col, tile_code, mask=scale_col < scale_cols)
            scale = tl.broadcast_to(tl.reshape(tile_scale, [1, BLOCK_C // 16]), [BLOCK_R, BLOCK_C // 16])
        else:
            scale, code = _e4m3_scale(block_amax * (encode * 0.16666666666666666))
            scale_mask = (row < rows)[:, None] & (scale_col < scale_cols)[None, :]
            scale_offsets = row.to(tl.int64)[:, None] * scale_cols + scale_col[None, :]
            tl.store(scales_ptr + scale_offsets, code, mask=scale_mask)
        reciprocal = _block_reciprocal(scale, decode)
        # Broadcast by expand_dims, not tl.reshape(.., [.., 1]): the reshape gave the 2D kernel's scales a
        # layout Triton then converted through shared memory (Triton 3.6: 712 SASS instructions and 6
        # barriers against 656 and 2; 89.9 -> 83.1 us at 8192 x 5120 bf16, run AK); the 1x16 kernels compile
        # the same either way.
        scaled = x3 * reciprocal[:, :, None]
        if STOCHASTIC and SR_BITS == 8:
            # One Philox call per 16-element block (counter = the first element's offset): four
            # words, 8 bits per element; element 4 w + b of the block gets byte b of word w.
            block_col = pid_c * BLOCK_C + 16 * tl.arange(0, BLOCK_C // 16)
            block_offsets = row.to(tl.int64)[:, None] * cols + block_col[None, :]  # [BLOCK_R, BLOCK_C / 16]
            w0, w1, w2, w3 = tl.randint4x(tl.load(seed_ptr), block_offsets)
            words = tl.reshape(tl.join(tl.join(w0, w1), tl.join(w2, w3)), [BLOCK_R, BLOCK_C // 16, 4])
            shifts = (8 * tl.arange(0, 4)).to(tl.uint32)
            random_bytes = (words[:, :, :, None] >> shifts[None, None, None, :]) & 255  # [.., word, byte]
            uniform = tl.reshape(_uniform_from_byte(random_bytes), [BLOCK_R, BLOCK_C // 16, 16])
        elif STOCHASTIC:
            # One Philox call per 4 consecutive elements (counter = the first one's offset), the
            # four draws interleaved back: column 4k + 2a + b gets draw 2a + b of counter k.
            quad_col = pid_c * BLOCK_C + 4 * tl.arange(0, BLOCK_C // 4)
            quad_offsets = row.to(tl.int64)[:, None] * cols + quad_col[None, :]  # [BLOCK_R, BLOCK_C / 4]
            u0, u1, u2, u3 = tl.rand4x(tl.load(seed_ptr), quad_offsets)
            uniform = tl.reshape(tl.join(tl.join(u0, u1), tl.join(u2, u3)), [BLOCK_R, BLOCK_C // 16, 16])
        else:
            uniform = scaled
        value, code_e2m1 = _round_e2m1(scaled, uniform, STOCHASTIC)
        value = value * scale[:, :, None]
        value = tl.reshape(value, [BLOCK_R, BLOCK_C])
        tl.store(values_ptr + offsets, value.to(values_ptr.dtype.element_ty), mask=mask)
        if WRITE_CODES:
            tl.store(codes_ptr + offsets, tl.reshape(code_e2m1, [BLOCK_R, BLOCK_C]), mask=mask)

    @triton.jit
    def _quantize_store_row(
        x, j, uniform, reciprocal, scale, base_offsets, cols, mask, values_ptr, codes_ptr,
        STOCHASTIC: tl.constexpr, WRITE_CODES: tl.constexpr,
    ):
        """Quantize element j of every 16-row group ([GROUPS, BLOCK_C]) and store row 16 g + j."""
        offsets = base_offsets + j * cols
        scaled = x * reciprocal
        if not STOCHASTIC:
            uniform = scaled  # unused by RNE
        value, code = _round_e2m1(scaled, uniform, STOCHASTIC)
        tl.store(values_ptr + offsets, (value * scale).to(values_ptr.dtype.element_ty), mask=mask)
        if WRITE_CODES:
            tl.store(codes_ptr + offsets, code, mask=mask)

    @triton.jit
    def _quantize_store_4_rows(
        xa, xb, xc, xd, j, reciprocal, scale, base_offsets, cols, mask, values_ptr, codes_ptr, seed, word,
        STOCHASTIC: tl.constexpr, WRITE_CODES: tl.constexpr, SR_BITS: tl.constexpr,
    ):
        """Rows 16 g + j .. j + 3. SR_BITS 8: their uniforms are the four bytes of ``word``; 32: one
        Philox call (counter = row j's element offsets) draws all four rows' uniforms, where one
        ``tl.rand`` per element would run Philox four times as often."""
        if STOCHASTIC and SR_BITS == 8:
            ua = _uniform_from_byte(word & 255)
            ub = _uniform_from_byte((word >> 8) & 255)
            uc = _uniform_from_byte((word >> 16) & 255)
            ud = _uniform_from_byte(word >> 24)
        elif STOCHASTIC:
            ua, ub, uc, ud = tl.rand4x(seed, base_offsets + j * cols)
        else:
            ua = xa
            ub = xb
            uc = xc
            ud = xd
        _quantize_store_row(xa, j, ua, reciprocal, scale, base_offsets, cols, mask, values_ptr, codes_ptr,
                            STOCHASTIC, WRITE_CODES)
        _quantize_store_row(xb, j + 1, ub, reciprocal, scale, base_offsets, cols, mask, values_ptr, codes_ptr,
                            STOCHASTIC, WRITE_CODES)
        _quantize_store_row(xc, j + 2, uc, reciprocal, scale, base_offsets, cols, mask, values_ptr, codes_ptr,
                            STOCHASTIC, WRITE_CODES)
        _quantize_store_row(xd, j + 3, ud, reciprocal, scale, base_offsets, cols, mask, values_ptr, codes_ptr,
                            STOCHASTIC, WRITE_CODES)

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
        ROUND_BF16: tl.constexpr,  # 0: none (fp32 input), 1: integer RNE, 2: hardware RNE (BF16_ROUNDING)
        STOCHASTIC: tl.constexpr,
        WRITE_CODES: tl.constexpr,
        SCALES_FROM_AMAX: tl.constexpr,
        REVERSED: tl.constexpr,
        SR_BITS: tl.constexpr,
    ):
        """GROUPS groups of 16 rows x BLOCK_C cols; blocks are 16x1 (down the columns)."""
        pid_g, pid_c = _tile_of_program(tl.cdiv(cols, BLOCK_C), REVERSED)
        encode, decode = _load_global_scales(global_ptr, amax_ptr, (pid_g == 0) & (pid_c == 0), SCALES_FROM_AMAX)
        group = pid_g * GROUPS + tl.arange(0, GROUPS)
        col = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = (group < groups)[:, None] & (col < cols)[None, :]
        base_offsets = (group.to(tl.int64) * 16)[:, None] * cols + col[None, :]
        base = x_ptr + base_offsets
        x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15 = _load_16_rows(base, cols, mask)
        if RHT:
            x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15 = _rht16(
                x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, ROUND_BF16
            )
        block_amax = _max_abs_16(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, NAN_TO_INF=False)
        scale, scale_code = _e4m3_scale(block_amax * (encode * 0.16666666666666666))
        scale_offsets = group.to(tl.int64)[:, None] * cols + col[None, :]
        tl.store(scales_ptr + scale_offsets, scale_code, mask=mask)
        reciprocal = _block_reciprocal(scale, decode)
        if STOCHASTIC:
            seed = tl.load(seed_ptr)
        else:
            seed = 0
        if STOCHASTIC and SR_BITS == 8:
            # One Philox call per 16x1 block (counter = its first element's offset): row 16 g + 4 w + b
            # gets byte b of word w.
            w0, w1, w2, w3 = tl.randint4x(seed, base_offsets)
        else:
            w0 = seed
            w1 = seed
            w2 = seed
            w3 = seed
        _quantize_store_4_rows(x0, x1, x2, x3, 0, reciprocal, scale, base_offsets, cols, mask,
                               values_ptr, codes_ptr, seed, w0, STOCHASTIC, WRITE_CODES, SR_BITS)
        _quantize_store_4_rows(x4, x5, x6, x7, 4, reciprocal, scale, base_offsets, cols, mask,
                               values_ptr, codes_ptr, seed, w1, STOCHASTIC, WRITE_CODES, SR_BITS)
        _quantize_store_4_rows(x8, x9, x10, x11, 8, reciprocal, scale, base_offsets, cols, mask,
                               values_ptr, codes_ptr, seed, w2, STOCHASTIC, WRITE_CODES, SR_BITS)
        _quantize_store_4_rows(x12, x13, x14, x15, 12, reciprocal, scale, base_offsets, cols, mask,
                               values_ptr, codes_ptr, seed, w3, STOCHASTIC, WRITE_CODES, SR_BITS)


if triton is not None:

    @triton.jit
    def _scale_gemm_output_kernel(
        out_ptr, result_ptr, decode_ptr, decode_b_ptr, numel, BLOCK: tl.constexpr, WIDEN_FROM_BF16: tl.constexpr,
        TWO_DECODES: tl.constexpr,
    ):
        """result = (out * S_dec) rounded to result's dtype, or (WIDEN_FROM_BF16) rounded to bf16 and
        stored as fp32; one fp32 multiply, one RNE rounding, as torch's mul-then-cast. TWO_DECODES:
        S_dec = decode * decode_b, the operands' two per-tensor decode scales (one fp32 product, as
        torch's), so no separate launch multiplies them."""
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < numel
        decode = tl.load(decode_ptr)
        if TWO_DECODES:
            decode = decode * tl.load(decode_b_ptr)
        scaled = tl.load(out_ptr + offsets, mask=mask, other=0.0) * decode
        if WIDEN_FROM_BF16:
            tl.store(result_ptr + offsets, _round_to_bf16(scaled, False), mask=mask)
        elif result_ptr.dtype.element_ty == tl.bfloat16:
            # Rounded by integer RNE first, so the cast is exact whatever rounding the backend's
            # fp32 -> bf16 conversion uses.
            tl.store(result_ptr + offsets, _round_to_bf16(scaled, False).to(tl.bfloat16), mask=mask)
        else:
            tl.store(result_ptr + offsets, scaled.to(result_ptr.dtype.element_ty), mask=mask)


# Launch configurations: (tile rows, tile cols, num_warps) for the row kernels, (groups of 16
# rows, cols, num_warps) for the column kernels; 16-32 elements per thread keeps registers < 128.
# The benchmark (scripts/bench_quant.py) times alternatives and reports the best. Columns: 4 groups
# x 128 cols x 8 warps (32 elements per thread) was the fastest or within 0.3% of it for RNE, with
# and without RHT, at 8192 x 5120 and 32768 x 1024 on the H200 (2026-12-03): 121.8 us against 141.6
# for the former 2 x 128 x 8. Rows: 16 x 256 x 4 since run W, the fastest launch there both for RNE
# (76.2 us against 79.5 at 16 x 128 x 4) and for stochastic rounding (96.0 against 101.5), 8192 x
# 5120, GPU time; 64 registers with RNE and 75 with SR, no spills (scripts/kernel_resources.py).
# The 2D kernel (the weights) takes 16 x 64 x 2 (TWO_D_CONFIG): 89.9 us against 140.1 at 16 x 256 x 4
# for bf16 input, 113.3 against 165.2 for fp32 (the FP32 master weights), 8192 x 5120, GPU time
# (run Z, 2026-12-04); 83.1 and 106.1 us since its scales broadcast without a reshape (run AK).
# Stochastic rounding in the columns kernel takes 2 groups x 128 cols x 4 warps (run AC, 2026-12-04,
# RHT, global scales given, each call on an input not in L2, GPU time): 86.6 us against 91.0 at the
# former 1 x 128 x 4 (8192 x 5120), 334.4 against 354.3 (8192 x 20480), 78.8 against 82.6 (32768 x
# 1152), and 4-5% less at the study's widths 256 to 1024. At two elements per thread and row Triton
# 3.6 computes the Philox words in another register layout than the data and moves them through
# shared memory (31 barriers per program, scripts/kernel_resources.py), which 1 x 128 x 4 avoids;
# the second group per program pays for that.
ROWS_CONFIG = (16, 256, 4)
ROWS_CONFIG_NARROW = (32, 128, 4)
"""The rows kernels' launch when cols is not a multiple of ROWS_CONFIG's 256 (e.g. the study's Mamba
in_proj, 1152 = 4.5 x 256, whose last 256-wide tile would be half masked): the same 4096 elements per
program in 128-wide tiles. 48.4 us RNE and 63.8 SR against 52.4 and 72.4 at 16 x 256 x 4 (32768 x
1152 bf16, run AC); at widths that 256 divides it was within 0.5 us of ROWS_CONFIG."""
TWO_D_CONFIG = (16, 64, 2)
COLUMNS_CONFIG = (4, 128, 8)
COLUMNS_STOCHASTIC_CONFIG = (2, 128, 4)
AMAX_REDUCTION = "triton"
"""How the per-tensor amax of the non-RHT kernels is taken: "triton" (``_amax_chunks_kernel``: 16K
elements per program, more past 2^26 elements; one atomic max each into a zeroed fp32) or "torch"
(one ATen/Inductor max-abs reduction). On the H200 the Triton pass read x at ~96% of copy bandwidth
and torch's at ~73% (8192 x 20480 bf16, run V), 24.9 against 29.8 us at 8192 x 5120 (GPU time, run
W); scripts/bench_quant.py times both."""
AMAX_CHUNK = (4096, 4, 8)
"""(elements per load, loads in flight, num_warps) of ``_amax_chunks_kernel``."""
AMAX_MAX_PROGRAMS = 4096
"""At most this many programs (and atomics) in the Triton amax pass: larger tensors give each more."""
AMAX_PROGRAMS_PER_SM = 4
"""Programs per SM of the persistent RHT amax kernel."""
RHT_AMAX_CONFIG = (4, 128, 4)
"""(groups of 16 rows, cols, num_warps) of one step of the persistent RHT amax kernel. Run Z (8192 x
5120, GPU time with the finalize): 40.4 us for bf16 (51% of copy bandwidth) against 48.1 at the former
(2, 128, 4); fp32 43.2 against 43.5 (every variant timed was within 1% for fp32)."""
RHT_PLAIN_AMAX_CONFIG = (4, 128, 4)
"""RHT_AMAX_CONFIG for the pass that also takes max |x| (``rows_and_rht_columns_scales``), bf16 input
(X and dY under autocast): 48.8 us against 54.2 at (4, 64, 4), 8192 x 5120, GPU time (run AA). It
compiles to 128 registers with the hardware bf16 rounding (Triton 3.6), the cap CI's compile check
allows: four programs of 128 threads per SM still fit (AMAX_PROGRAMS_PER_SM), a fifth would not;
(4, 64, 4) leaves room if an edit needs it."""
RHT_PLAIN_AMAX_CONFIG_FP32 = (4, 64, 4)
"""The same for fp32 input: the second maximum keeps the 16 loaded rows live through the transform,
and at (4, 128, 4) Triton 3.6 compiled that to 168 registers for fp32 (3 programs per SM resident,
below AMAX_PROGRAMS_PER_SM), at (4, 64, 4) to 64 without spills (scripts/kernel_resources.py); not
timed."""
SHARED_SCALES = True
"""Whether ``models.quant.linear`` takes the global scales of an operand it quantizes in both
orientations (rows 1x16 and columns with the RHT: X, dY) from one ``rows_and_rht_columns_scales``
pass instead of two amax passes (same outputs; a knob for the step benchmark's A/B)."""
MAX_PARTIALS = 4096
REVERSED_QUANTIZE_PASS = True
"""Walk the quantize pass's tiles from the last (reading first what the amax pass read last)."""
BF16_ROUNDING = "hardware"
"""How the RHT kernels round the transformed values to bf16 (bf16 input, as TE's RHT output is bf16):
"hardware" (the fp32 -> bf16 conversion, cvt.rn.bf16.f32, the instruction torch's CUDA .to(bfloat16)
uses) or "integer" (add 0x7FFF plus the lowest kept bit, mask). Both are RNE and gave identical outputs
on the H200 (run AB, the columns tests at 4 shapes x 3 scales); "hardware" compiles to ~22% fewer SASS
instructions in the RHT amax pass and ran it in 30.0 us against 39.6 (columns with RHT: 92.3 against
108.2 us RNE, 120.0 against 133.1 SR; 8192 x 5120, GPU time). Under Triton's interpreter "integer"
always (its conversion truncates), so CI's interpreter checks cover that path and the GPU tests both."""
SR_BITS = 8
"""Random bits per element of stochastic rounding: 8 (one Philox call per 16 elements, as TE's
cvt.rs.e2m1x4 takes one 32-bit word per 4 values) or 32 (``tl.rand4x``'s full uniforms, one call per
4 elements)."""


def rows_config(cols: int) -> tuple:
    """The 1x16 rows kernels' default launch for a tensor ``cols`` wide (ROWS_CONFIG_NARROW where
    ROWS_CONFIG's tile width does not divide it)."""
    return ROWS_CONFIG if cols % ROWS_CONFIG[1] == 0 else ROWS_CONFIG_NARROW


def _check_input(x: torch.Tensor, rows_multiple: int, what: str, name: Optional[str]) -> None:
    require_triton("models.quant.kernels")
    where = f"{name}: " if name else ""
    if not (x.is_cuda or INTERPRETING):
        raise ValueError(f"{where}{what} needs a CUDA tensor, got device {x.device}")
    if x.dtype not in KERNEL_INPUT_DTYPES:
        raise TypeError(f"{where}{what} takes {KERNEL_INPUT_DTYPES}, got {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"{where}{what} takes a 2D tensor, got shape {list(x.shape)}")
    rows, cols = x.shape
    if cols % 16 != 0:
        raise ValueError(f"{where}{what}: last dim {cols} is not a multiple of 16")
    if rows % rows_multiple != 0:
        raise ValueError(f"{where}{what}: leading dim {rows} is not a multiple of {rows_multiple}")


def _seed_tensor(x: torch.Tensor, seed, generator: Optional[torch.Generator]) -> torch.Tensor:
    """A 1-element int64 seed on x's device: given, or drawn from the generator / global RNG."""
    if isinstance(seed, torch.Tensor):
        return seed.to(device=x.device, dtype=torch.int64).reshape(1)
    if seed is not None:
        return torch.tensor([int(seed)], dtype=torch.int64, device=x.device)
    if generator is not None:
        drawn = torch.randint(0, 2**62, (1,), generator=generator, device=generator.device, dtype=torch.int64)
        return drawn.to(x.device)
    return torch.randint(0, 2**62, (1,), device=x.device, dtype=torch.int64)


def _amax_programs(x: torch.Tensor, num_tiles: int) -> int:
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 2
    return max(1, min(num_tiles, AMAX_PROGRAMS_PER_SM * sms, MAX_PARTIALS))


def tensor_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| as a 1-element tensor (fp32 by the Triton pass, x's dtype by torch's; see
    AMAX_REDUCTION). A max is exact in any order and dtype (it is one of x's values, or 0); a NaN or
    Inf in x comes out as Inf (Triton) or NaN/Inf (torch), which the kernels turn into a NaN decode
    scale."""
    if AMAX_REDUCTION == "torch":
        # ATen's reduction (inside torch.compile, Inductor's)
        return torch.linalg.vector_norm(x, float("inf")).reshape(1)
    block, unroll, warps = AMAX_CHUNK
    numel = x.numel()
    step = block * unroll
    per_program = step * triton.cdiv(numel, step * AMAX_MAX_PROGRAMS)
    amax = torch.zeros(1, dtype=torch.float32, device=x.device)
    _amax_chunks_kernel[(triton.cdiv(numel, per_program),)](
        x, amax, numel, per_program, BLOCK=block, UNROLL=unroll, num_warps=warps, enable_fp_fusion=False,
    )
    return amax


def _bf16_rounding(x: torch.Tensor) -> int:
    """The RHT kernels' ROUND_BF16: 0 for fp32 input (the transform stays fp32), 1 integer, 2 hardware."""
    if x.dtype != torch.bfloat16:
        return 0
    return 2 if BF16_ROUNDING == "hardware" and not INTERPRETING else 1


def _rht_amax_config(dtype: torch.dtype, plain_amax: bool) -> tuple:
    if not plain_amax:
        return RHT_AMAX_CONFIG
    return RHT_PLAIN_AMAX_CONFIG_FP32 if dtype == torch.float32 else RHT_PLAIN_AMAX_CONFIG


def rht_global_scales(x: torch.Tensor, *, plain_amax: bool = False) -> torch.Tensor:
    """[S_enc, S_dec] (fp32, on x's device) from max |rht along dim 0 (x)|: two launches (the
    persistent RHT amax pass, then a one-program finalize). Without RHT the quantize kernels take
    ``tensor_amax`` and derive the two scales themselves.

    ``plain_amax``: [S_enc, S_dec, max |x|] from the same read, the third element being what
    ``tensor_amax(x)`` returns (NaN/Inf as Inf). An operand quantized both along rows (1x16, no RHT)
    and along columns with the RHT (X: Fprop and Wgrad; dY: Dgrad and Wgrad) passes element 2 as the
    rows call's ``amax`` and the tensor as the columns call's ``global_scales``: three reads of x for
    its two orientations instead of four."""
    x = x.contiguous()
    rows, cols = x.shape
    rht_groups, rht_cols, warps = _rht_amax_config(x.dtype, plain_amax)
    groups = rows // 16
    tiles_c = triton.cdiv(cols, rht_cols)
    num_tiles = triton.cdiv(groups, rht_groups) * tiles_c
    programs = _amax_programs(x, num_tiles)
    partials = torch.empty(2 * programs if plain_amax else programs, dtype=torch.float32, device=x.device)
    _amax_columns_rht_kernel[(programs,)](
        x, partials, groups, cols, tiles_c, num_tiles, programs, GROUPS=rht_groups, BLOCK_C=rht_cols,
        ROUND_BF16=_bf16_rounding(x), PLAIN_AMAX=plain_amax, num_warps=warps, enable_fp_fusion=False,
    )
    global_scales = torch.empty(3 if plain_amax else 2, dtype=torch.float32, device=x.device)
    _finalize_scales_kernel[(1,)](
        partials, programs, global_scales, PARTIALS_POW2=max(32, triton.next_power_of_2(programs)),
        PLAIN_AMAX=plain_amax, num_warps=4, enable_fp_fusion=False,
    )
    return global_scales


def rows_and_rht_columns_scales(x: torch.Tensor, *, name: Optional[str] = None) -> torch.Tensor:
    """``rht_global_scales(x, plain_amax=True)`` with the input checks: [S_enc, S_dec] of the RHT
    columns orientation and max |x| for the rows orientation, from one read of x (rows % 16 == 0)."""
    _check_input(x, 16, "rows_and_rht_columns_scales", name)
    return rht_global_scales(x, plain_amax=True)


def _global_scales_or_amax(x: torch.Tensor, *, rht: bool, given: Optional[torch.Tensor] = None):
    """(global_scales [2] fp32, amax) for a quantize kernel. Without RHT there is no finalize launch:
    ``amax`` is max |x| (one value, ``tensor_amax``, or ``given``) and the kernel derives [S_enc,
    S_dec] itself, writing them into the (uninitialized) ``global_scales``; with RHT
    ``global_scales`` is rht_global_scales' output (or ``given``) and ``amax`` is that same tensor
    (a placeholder the kernel ignores)."""
    if given is not None and (given.dtype != torch.float32 or given.device != x.device
                              or given.numel() < (2 if rht else 1)):
        raise ValueError(f"precomputed {'global scales' if rht else 'amax'} must be fp32 on {x.device} with "
                         f"at least {2 if rht else 1} elements, got {given.dtype} {list(given.shape)} on {given.device}")
    if rht:
        global_scales = rht_global_scales(x) if given is None else given
        return global_scales, global_scales
    return torch.empty(2, dtype=torch.float32, device=x.device), tensor_amax(x) if given is None else given


def _outputs(x, scales_shape, out_dtype, write_codes):
    values = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    codes = torch.empty(x.shape, dtype=torch.uint8, device=x.device) if write_codes else values
    scales = torch.empty(scales_shape, dtype=torch.float8_e4m3fn, device=x.device)
    return values, codes, scales


def nvfp4_quantize_rows(
    x: torch.Tensor,
    *,
    two_d: bool = False,
    stochastic: bool = False,
    seed=None,
    generator: Optional[torch.Generator] = None,
    out_dtype: torch.dtype = torch.bfloat16,
    write_codes: bool = False,
    config: Optional[tuple] = None,
    amax: Optional[torch.Tensor] = None,
    name: Optional[str] = None,
) -> KernelQuantized:
    """NVFP4 of a [rows, cols] CUDA tensor with 1x16 blocks along cols (or 16x16 tiles if two_d).

    Equals ``formats.quantize(x, "nvfp4", tile=(1, 16) or (16, 16))`` for RNE. ``seed`` (int or
    1-element tensor) or ``generator`` seeds stochastic rounding; by default a seed is drawn from
    torch's global RNG on x's device (no host sync). ``config``: (tile rows, tile cols, num_warps);
    two_d forces 16 tile rows. ``amax``: max |x| already taken (fp32, its first element; element 2 of
    ``rows_and_rht_columns_scales``), which skips the amax pass.
    """
    _check_input(x, 16 if two_d else 1, "nvfp4_quantize_rows", name)
    x = x.contiguous()
    rows, cols = x.shape
    block_r, block_c, warps = config or (TWO_D_CONFIG if two_d else rows_config(cols))
    if two_d:
        block_r = 16
    global_scales, amax = _global_scales_or_amax(x, rht=False, given=amax)
    scales_shape = (rows // 16, cols // 16) if two_d else (rows, cols // 16)
    values, codes, scales = _outputs(x, scales_shape, out_dtype, write_codes)
    seed_tensor = _seed_tensor(x, seed, generator) if stochastic else global_scales
    grid = (triton.cdiv(rows, block_r) * triton.cdiv(cols, block_c),)
    _quantize_rows_kernel[grid](
        x, values, codes, scales.view(torch.uint8), global_scales, amax, seed_tensor, rows, cols,
        BLOCK_R=block_r, BLOCK_C=block_c, TWO_D=two_d, STOCHASTIC=stochastic, WRITE_CODES=write_codes,
        SCALES_FROM_AMAX=amax is not global_scales, REVERSED=REVERSED_QUANTIZE_PASS, SR_BITS=SR_BITS,
        num_warps=warps, enable_fp_fusion=False,
    )
    return KernelQuantized(values, scales, global_scales[1:2], codes if write_codes else None)


def nvfp4_quantize_columns(
    x: torch.Tensor,
    *,
    rht: bool = False,
    stochastic: bool = False,
    seed=None,
    generator: Optional[torch.Generator] = None,
    out_dtype: torch.dtype = torch.bfloat16,
    write_codes: bool = False,
    config: Optional[tuple] = None,
    global_scales: Optional[torch.Tensor] = None,
    name: Optional[str] = None,
) -> KernelQuantized:
    """NVFP4 of x [rows, cols] with 16x1 blocks along rows (dim 0), optionally after the RHT along rows.

    Equals ``formats.quantize(rht(x.t()) if rht else x.t(), "nvfp4")`` transposed back: outputs are
    in x's layout, scales [rows / 16, cols]. ``config``: (groups of 16 rows, cols, num_warps).
    ``global_scales`` (RHT only): [S_enc, S_dec, ...] already taken (``rows_and_rht_columns_scales``),
    which skips the amax pass; the returned decode scale is then a view of it.
    """
    if global_scales is not None and not rht:
        raise ValueError("nvfp4_quantize_columns takes precomputed global_scales with rht=True only")
    _check_input(x, 16, "nvfp4_quantize_columns", name)
    x = x.contiguous()
    rows, cols = x.shape
    groups_per_program, block_c, warps = config or (COLUMNS_STOCHASTIC_CONFIG if stochastic else COLUMNS_CONFIG)
    global_scales, amax = _global_scales_or_amax(x, rht=rht, given=global_scales)
    values, codes, scales = _outputs(x, (rows // 16, cols), out_dtype, write_codes)
    seed_tensor = _seed_tensor(x, seed, generator) if stochastic else global_scales
    grid = (triton.cdiv(rows // 16, groups_per_program) * triton.cdiv(cols, block_c),)
    _quantize_columns_kernel[grid](
        x, values, codes, scales.view(torch.uint8), global_scales, amax, seed_tensor, rows // 16, cols,
        GROUPS=groups_per_program, BLOCK_C=block_c, RHT=rht, ROUND_BF16=_bf16_rounding(x),
        STOCHASTIC=stochastic, WRITE_CODES=write_codes, SCALES_FROM_AMAX=amax is not global_scales,
        REVERSED=REVERSED_QUANTIZE_PASS, SR_BITS=SR_BITS, num_warps=warps, enable_fp_fusion=False,
    )
    return KernelQuantized(values, scales, global_scales[1:2], codes if write_codes else None)


EPILOGUE_BLOCK = 4096
EPILOGUE_WARPS = 8


def scale_gemm_output(out: torch.Tensor, decode: torch.Tensor, dtype: torch.dtype, *,
                      widen_to: Optional[torch.dtype] = None, decode_b: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(out * decode).to(dtype) in one pass over an fp32 GEMM output; with ``widen_to=torch.float32``
    (and dtype bf16) ``(out * decode).to(bf16).to(float32)``, written in place into ``out``.

    out: contiguous fp32 [M, N] (CUDA); decode: fp32 one-element tensor (the product of the operands'
    per-tensor decode scales; or, with ``decode_b``, the first of the two, multiplied here as
    ``decode * decode_b``). Bit for bit the torch expressions above: an fp32 multiply, then RNE to
    dtype (``_round_to_bf16`` for the widened case). The widened form is Wgrad's: the FP32 gradient
    of an FP32 master weight, computed in bf16, without a bf16 buffer and a widening copy. A NaN
    stays NaN, but its sign and payload bits may differ from torch's cast (which itself differs
    between CPU and CUDA); the tests compare NaN as NaN.
    """
    require_triton("models.quant.kernels.scale_gemm_output")
    if out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"scale_gemm_output takes a contiguous fp32 GEMM output, got {out.dtype}, "
                         f"strides {out.stride()}")
    widen = widen_to is not None and widen_to != dtype
    if widen and (dtype != torch.bfloat16 or widen_to != torch.float32):
        raise ValueError(f"scale_gemm_output widens bf16 to float32 only, got {dtype} -> {widen_to}")
    result = out if widen else torch.empty(out.shape, dtype=dtype, device=out.device)
    numel = out.numel()
    _scale_gemm_output_kernel[(triton.cdiv(numel, EPILOGUE_BLOCK),)](
        out, result, decode.reshape(1), (decode if decode_b is None else decode_b).reshape(1), numel,
        BLOCK=EPILOGUE_BLOCK, WIDEN_FROM_BF16=widen, TWO_DECODES=decode_b is not None,
        num_warps=EPILOGUE_WARPS, enable_fp_fusion=False,
    )
    return result
