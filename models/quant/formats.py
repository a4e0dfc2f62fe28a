"""Block-scaled low-precision formats: quantize and dequantize, emulated bit for bit in fp32.

Every tensor is treated as 2D: leading dims are flattened into rows, blocks (tiles) run along the
last dim unless a 2D tile says otherwise. A dim that does not divide the tile raises ValueError;
nothing is ever padded. All arithmetic is fp32, in the order written below.

nvfp4 (Transformer Engine ``core_nvfp4.cuh``; E2M1 elements, E4M3 block scales, fp32 tensor scale)
    amax    = max |x| over the tensor
    S_enc   = min(448 * 6 / amax, FLT_MAX);  S_enc = 1 if amax == 0 or S_enc == 0
    s_b     = e4m3(block_amax * (S_enc * (1/6)))          RNE, saturating at 448
    r_b     = min(1 / (fp32(s_b) * (1 / S_enc)), FLT_MAX)
    q       = e2m1(x * r_b)                                RNE or stochastic, saturating at 6
    x_hat   = q * fp32(s_b) * (1 / S_enc)
  tiles (1, 16) (default) or (16, 16) (one scale per 16x16 tile, "2D").
  x_hat is *our* dequantization (``dequantize``), the order the emulated GEMM uses: q * s_b, then
  the per-tensor decode scale (TE's cuBLAS GEMM instead scales its output by alpha = amax_a * amax_b
  * fp32(1 / (36 * 448^2)), recipe/nvfp4.cu). Two places where TE's quantize/dequantize code differs
  from this module (docs/numerics.md, "NVFP4 and TE: where the bits differ"):
  - TE's standalone dequantize kernel (``dequantize_nvfp4.cuh``, ``dequantize_fp4_kernel``) reads the
    stored amax, not 1/S_enc:  x_te = q * ((fp32(s_b) * amax) * fp32(1 / (6 * 448))), one rounding
    per product. That factor differs from fp32(s_b) * (1/S_enc) in the last bit(s) for many blocks
    (up to a few fp32 ulp). ``QuantizedTensor.dequantize_te_standalone`` computes TE's order.
  - A scaled value x * r_b of -0.0 (an input of -0.0) gets E2M1 code 8 (-0) here, as ml_dtypes'
    cast does; TE's pure-torch reference (``NVFP4QuantizerRef``, ``cast_to_fp4x2``) stores code 0
    (+0). Negative values that round to zero get code 8 in both. Decoded, -0.0 == +0.0, so GEMM
    sums are unchanged. The encoder is left as it is: the Triton kernels match it bit for bit.

mxfp4 / mxfp8 (OCP Microscaling Formats v1.0, section 6.3; E2M1 / E4M3 elements, E8M0 scales)
    X       = 2 ** clamp(floor(log2(block_amax)) - emax_elem, -127, 127)     emax_elem = 2 (E2M1), 8 (E4M3)
    q       = element(x / X)                               RNE, saturating (6 or 448)
    x_hat   = q * X
  An all-zero block takes the smallest scale, 2^-127 (microxcaling's convention). tile (1, 32).
  Note: TE's own MXFP8 rounds amax/448 *up* to a power of two (so nothing saturates); we follow
  the OCP spec as the project asked.

fp8_block (TE ``Float8BlockScaling``: ``recipe_common.cuh: compute_scale_from_amax``; E4M3
elements, one fp32 scale per 1x128 (default) or 128x128 tile)
    scale   = 1 if block_amax == 0, else 448 / block_amax
    scale   = max finite value of the input dtype if that overflowed to inf
    scale   = scale with its mantissa bits cleared (power of two, rounded down) if power_of_two_scales
    q       = e4m3(x * scale)                              RNE, saturating
    x_hat   = q * (1 / scale)                              (1/scale is what TE stores: scale_inv)

fp8_tensor (TE ``Float8CurrentScaling``: one fp32 scale per tensor, E4M3)
    scale   = 448 / amax (1 if amax == 0; FLT_MAX if it overflowed); q = e4m3(x * scale);
    x_hat   = q * (1 / scale)

Rounding. "nearest" is round-half-to-even onto the element grid, after saturating to the largest
finite element. "stochastic" (E2M1 formats only) rounds |v| to one of its two neighbouring grid
points lo <= |v| <= hi, up with probability (|v| - lo) / (hi - lo): one uniform u in [0, 1) per
element, drawn as ``torch.rand(rows, cols, generator=generator)`` over the flattened 2D tensor in
row-major order, and |v| rounds up iff u < (|v| - lo) / (hi - lo). Unbiased on the grid:
E[q] = v for |v| <= 6.

Non-finite input (a deliberate deviation from TE, which maps an Inf amax to S_enc = 1 and so clips
Inf to +-6 * 448 without a word). Here a NaN or Inf in a scaling block makes that block's decode
scale NaN, so the whole block dequantizes to NaN; for the formats with a per-tensor scale (nvfp4,
fp8_tensor) a NaN or Inf anywhere makes the per-tensor decode scale NaN, so the whole tensor
dequantizes to NaN. Nothing non-finite is ever clipped to a finite value. Element codes under a NaN
scale are meaningless (E2M1 has no NaN code; they are stored as 0).

Two paths, bit-identical (the tests check it on every format, ties, zeros, subnormal scales and
NaN/Inf included):
- ``quantize`` builds the element codes (storage, packing, tests) by threshold comparisons and
  decodes them through ``E2M1_GRID``: the reference.
- ``quantize_scaled_values`` / ``fake_quantize`` need only the values q * s_b (what an emulated GEMM
  multiplies), so they round arithmetically and never build codes. E2M1 with step = the grid spacing
  at |v| (0.5 below 2, 1 in [2, 4), 2 from 4; |v| saturated at 6 first):
      nearest:     |q| = round_half_even(|v| / step) * step
      stochastic:  |q| = (floor(|v| / step) + (u < frac)) * step,  frac = |v| / step - floor(|v| / step)
  |v| / step is exact (step is a power of two), so frac is exactly (|v| - lo) / (hi - lo) above; at
  |v| = 6, frac = 0 and nothing rounds up. The sign is copied from x (r_b > 0). E4M3 elements are
  the same cast in both paths.

Sources: TE ``transformer_engine/common/cast/nvfp4/core_nvfp4.cuh``,
``transformer_engine/common/cast/nvfp4/dequantize_nvfp4.cuh`` (standalone dequantize),
``transformer_engine/common/recipe/recipe_common.cuh``, ``transformer_engine/common/recipe/
current_scaling.cu``, ``transformer_engine/pytorch/custom_recipes/quantization_nvfp4.py`` and
``reference_nvfp4.py`` (reference quantizer, ``cast_to_fp4x2``), OCP MX v1.0 spec. The tests check
every format element by element against ml_dtypes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, NamedTuple, Optional, Tuple

import torch

from models.quant.format_registry import (  # noqa: F401 - re-exported: formats.resolve_tile etc.
    E2M1_FORMATS,
    E2M1_MAX,
    E4M3_MAX,
    OPERAND_FORMATS,
    ROUNDINGS,
    resolve_tile,
)

# The formats' facts (tiles, element kind and max, roundings) live in models.quant.format_registry.
FORMATS = OPERAND_FORMATS
"""The element formats this module quantizes."""

FLT_MAX = torch.finfo(torch.float32).max
# E2M1 magnitudes by code (bits s e e m: code & 7 indexes this table, code & 8 is the sign).
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Largest exponent of the element format (emax_elem in the OCP MX spec).
MX_ELEMENT_EMAX = {"mxfp4": 2, "mxfp8": 8}
E8M0_BIAS = 127
E8M0_NAN_CODE = 255

_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _fp32(value: float, device) -> torch.Tensor:
    """A 0-dim fp32 constant: keeps every scalar op in fp32, as the CUDA code does."""
    return torch.tensor(value, dtype=torch.float32, device=device)


def _blocking_problem(shape, tile) -> Optional[str]:
    """Which dim of ``shape`` does not divide into ``tile``: 'rank', 'empty', 'last', 'leading'; None if all do."""
    if len(shape) == 0:
        return "rank"
    cols = shape[-1]
    rows = 1
    for dim in shape[:-1]:
        rows *= dim
    if rows * cols == 0:
        return "empty"
    if tile is None:
        return None
    if cols % tile[1] != 0:
        return "last"
    if rows % tile[0] != 0:
        return "leading"
    return None


def blockable(shape, fmt: str, tile) -> bool:
    """Whether ``shape`` divides into ``fmt`` tiles (``check_blockable`` without building a message)."""
    return _blocking_problem(tuple(shape), resolve_tile(fmt, tile)) is None


def check_blockable(
    shape, fmt: str, tile, *, name: Optional[str] = None, dim_names: Optional[Tuple[str, str]] = None
) -> None:
    """Raise ValueError (naming ``name`` and the dim) unless ``shape`` divides into ``fmt`` tiles.

    Blocks run along the last dim; a 2D tile also needs the flattened leading dims to divide.
    ``dim_names`` (leading, last), e.g. ("out_features", "tokens"), label the dims in the message.
    The message is formatted only on failure (torch.compile then never reads ``name``).
    """
    tile = resolve_tile(fmt, tile)
    shape = tuple(shape)
    problem = _blocking_problem(shape, tile)
    if problem is None:
        return
    where = f"{name}: " if name else ""
    if problem == "rank":
        raise ValueError(f"{where}cannot quantize a 0-dim tensor to {fmt}")
    if problem == "empty":
        raise ValueError(f"{where}cannot quantize an empty tensor of shape {list(shape)} to {fmt}")
    rows = 1
    for dim in shape[:-1]:
        rows *= dim
    if problem == "last":
        last_label = f" ({dim_names[1]})" if dim_names else ""
        raise ValueError(
            f"{where}last dim{last_label} {shape[-1]} (shape {list(shape)}) is not a multiple of the {fmt} block "
            f"length {tile[1]} (tile {tile[0]}x{tile[1]}); nothing is padded: change the size or keep "
            f"this tensor in high precision"
        )
    leading_label = f" ({dim_names[0]})" if dim_names else ""
    raise ValueError(
        f"{where}leading dim{leading_label} {rows} (shape {list(shape)}, leading dims flattened) is not a multiple "
        f"of the {fmt} tile height {tile[0]} (tile {tile[0]}x{tile[1]}); nothing is padded"
    )


@dataclass
class QuantizedTensor:
    """A quantized tensor: the real element codes and scales, enough to dequantize exactly.

    Shapes, with ``rows`` = product of the leading dims and ``cols`` = last dim, tile (tr, tc):
    - ``codes``: [rows, cols]. E2M1 formats: uint8, one code per element in the low 4 bits
      (bit 3 sign, bits 0-2 index ``E2M1_GRID``); ``packed_codes()`` gives two per byte.
      E4M3 formats: torch.float8_e4m3fn.
    - ``block_scales``: [rows / tr, cols / tc] decode scales: float8_e4m3fn (nvfp4),
      float8_e8m0fnu (mxfp4, mxfp8), float32 ``1/scale`` (fp8_block); None for fp8_tensor.
    - ``tensor_scale``: 0-dim fp32 per-tensor decode scale (nvfp4: 1/S_enc; fp8_tensor: 1/scale);
      None for the formats without one.
    Who needs only the values (an emulated GEMM) calls ``quantize_scaled_values`` or
    ``fake_quantize``: the same bits as ``scaled_values()`` / ``dequantize()``, without codes.
    """

    fmt: str
    codes: torch.Tensor
    block_scales: Optional[torch.Tensor]
    tensor_scale: Optional[torch.Tensor]
    tile: Optional[Tuple[int, int]]
    shape: torch.Size
    """Shape of the tensor that was quantized (dequantize() returns this shape)."""
    dtype: torch.dtype
    """Dtype of the tensor that was quantized (dequantize()'s default)."""
    power_of_two_scales: bool = False
    """fp8_block only: whether the block scales were rounded down to powers of two."""
    amax: Optional[torch.Tensor] = None
    """nvfp4 only: the 0-dim fp32 tensor amax that S_enc came from. TE stores it with the tensor,
    and its standalone dequantize kernel reads it (``dequantize_te_standalone``); 1/S_enc alone
    does not determine it."""

    @property
    def rows(self) -> int:
        return self.codes.shape[0]

    @property
    def cols(self) -> int:
        return self.codes.shape[1]

    def element_values(self) -> torch.Tensor:
        """The grid values q as fp32, [rows, cols] (before any scale)."""
        if self.fmt in E2M1_FORMATS:
            grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=self.codes.device)
            magnitude = grid[(self.codes & 7).long()]
            return torch.where((self.codes & 8) != 0, -magnitude, magnitude)
        return self.codes.float()

    def block_scales_fp32(self) -> torch.Tensor:
        """Per-block decode scales as fp32, broadcastable to the 4D blocked view [R/tr, 1, C/tc, 1]."""
        if self.block_scales is None:
            return torch.ones((1, 1, 1, 1), dtype=torch.float32, device=self.codes.device)
        scales = self.block_scales.float()
        return scales[:, None, :, None]

    def _blocked(self, values: torch.Tensor) -> torch.Tensor:
        return _blocked_view(values, self.tile)

    def scaled_values(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """q * s_b without the per-tensor decode scale, in the original shape.

        What a block-scaled GEMM multiplies before it applies the per-tensor scales to its fp32
        output. Exact in bf16 for nvfp4, mxfp4/mxfp8 (outside the extreme exponents) and fp8_tensor,
        and for fp8_block with power-of-two scales: see ``scaled_values_exact_in``.
        """
        values = self._blocked(self.element_values()) * self.block_scales_fp32()
        return values.reshape(self.shape).to(dtype)

    def scaled_values_exact_in(self, dtype: torch.dtype) -> bool:
        """Whether ``scaled_values(dtype)`` is exact (q * s_b needs few significant bits)."""
        if dtype == torch.float32:
            return True
        if self.fmt == "fp8_block":
            return self.power_of_two_scales
        return True

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """x_hat = (q * s_b) * tensor_scale in fp32, then cast to ``dtype`` (default: the input's)."""
        values = self._blocked(self.element_values()) * self.block_scales_fp32()
        if self.tensor_scale is not None:
            values = values * self.tensor_scale
        return values.reshape(self.shape).to(dtype or self.dtype)

    def dequantize_te_standalone(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """nvfp4: x = q * ((fp32(s_b) * amax) * fp32(1 / 2688)) in fp32, then cast to ``dtype``.

        The arithmetic of TE's standalone NVFP4 dequantize kernel (transformer_engine/common/cast/
        nvfp4/dequantize_nvfp4.cuh, ``dequantize_fp4_kernel``: ``final_scale = scale * amax *
        factor_inv`` with ``factor_inv = 1.0 / (6.0 * 448.0)`` as an fp32 constant, evaluated left to
        right, then ``q * final_scale`` and a cast to the output type). It is *not* what a GEMM sees:
        training multiplies q * s_b and applies the per-tensor scales to the GEMM's fp32 output (see
        ``dequantize`` and models/quant/linear.py). Use it to compare with tensors that TE itself
        dequantized. A non-finite amax gives NaN everywhere, as ``dequantize`` does (s_b is NaN).
        """
        if self.fmt != "nvfp4":
            raise ValueError(f"dequantize_te_standalone() is TE's NVFP4 dequantize, not for {self.fmt}")
        if self.amax is None:
            raise ValueError("this nvfp4 QuantizedTensor carries no amax (build it with quantize())")
        # The constant is rounded once to fp32, as the CUDA constexpr float is.
        factor = _fp32(1.0 / (E2M1_MAX * E4M3_MAX), self.codes.device)
        block_factor = (self.block_scales_fp32() * self.amax) * factor  # two fp32 roundings, TE's order
        values = self._blocked(self.element_values()) * block_factor
        return values.reshape(self.shape).to(dtype or self.dtype)

    def packed_codes(self) -> torch.Tensor:
        """E2M1 codes two per byte, [rows, cols / 2] uint8: even column in the low nibble (TE's layout)."""
        if self.fmt not in E2M1_FORMATS:
            raise ValueError(f"packed_codes() is for E2M1 formats, not {self.fmt}")
        return self.codes[:, 0::2] | (self.codes[:, 1::2] << 4)


def _blocked_view(x2d: torch.Tensor, tile) -> torch.Tensor:
    """View [R, C] as [R/tr, tr, C/tc, tc] (per-tensor: [1, R, 1, C]); block reductions use dims (1, 3).

    Always a view, also of a transposed (column-major) ``x2d``: element-wise ops on it then keep
    that memory order, so a transposed operand is never copied into row-major order.
    """
    rows, cols = x2d.shape
    if tile is None:
        return x2d.reshape(1, rows, 1, cols)
    tile_rows, tile_cols = tile
    return x2d.reshape(rows // tile_rows, tile_rows, cols // tile_cols, tile_cols)


def _block_amax(blocked: torch.Tensor) -> torch.Tensor:
    """max |x| per block (NaN if the block has a NaN), fp32, shape [R/tr, 1, C/tc, 1]."""
    return _block_max(blocked.abs())


def _block_max(blocked: torch.Tensor) -> torch.Tensor:
    """max per block of a blocked view [R/tr, tr, C/tc, tc] -> [R/tr, 1, C/tc, 1] (NaN propagates).

    A column-major (transposed) operand is reduced in its memory order, with the block columns
    outermost, so that the reduction runs along contiguous memory; the result is the same.
    """
    if blocked.stride(3) == 1:  # row-major: blocks along contiguous memory
        return blocked.amax(dim=(1, 3), keepdim=True)
    columns_first = blocked.permute(2, 3, 0, 1)  # [C/tc, tc, R/tr, tr]: row-major storage of x2d.t()
    return columns_first.amax(dim=(1, 3), keepdim=True).permute(2, 3, 0, 1)


# ----------------------------------------------------------------------------------------------
# Element rounding, codes path (the reference: what quantize() stores)


def _round_e2m1(
    scaled: torch.Tensor, rounding: str, uniform: Optional[torch.Tensor]
) -> torch.Tensor:
    """E2M1 codes (uint8) of fp32 ``scaled``: saturate to 6, then RNE or stochastic rounding.

    RNE thresholds (ties go to the even code): 0.25->0, 0.75->1.0, 1.25->1.0, 1.75->2.0,
    2.5->2.0, 3.5->4.0, 5.0->4.0. NaN gets code 0 (its scale is NaN, so it decodes to NaN).
    """
    magnitude = scaled.abs().clamp(max=E2M1_MAX)  # NaN stays NaN; comparisons with NaN are False
    if rounding == "nearest":
        index = (
            (magnitude > 0.25).to(torch.uint8)
            + (magnitude >= 0.75)
            + (magnitude > 1.25)
            + (magnitude >= 1.75)
            + (magnitude > 2.5)
            + (magnitude >= 3.5)
            + (magnitude > 5.0)
        )
    else:
        # lo = largest grid point <= |v|; step to the next grid point; frac = (|v| - lo) / step is
        # exact (Sterbenz: lo <= |v| < 2 lo, and step is a power of two).
        lower = (
            (magnitude >= 0.5).to(torch.uint8)
            + (magnitude >= 1.0)
            + (magnitude >= 1.5)
            + (magnitude >= 2.0)
            + (magnitude >= 3.0)
            + (magnitude >= 4.0)
            + (magnitude >= 6.0)
        )
        grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=scaled.device)
        # 1 / (grid step above each grid point); 0 at the top so 6 never rounds up.
        inverse_step = torch.tensor(
            (2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 0.5, 0.0), dtype=torch.float32, device=scaled.device
        )
        lower_long = lower.long()
        fraction = (magnitude - grid[lower_long]) * inverse_step[lower_long]
        index = lower + (uniform < fraction).to(torch.uint8)
    negative = torch.signbit(scaled) & ~torch.isnan(scaled)
    return index | (negative.to(torch.uint8) << 3)


def _round_e4m3(scaled: torch.Tensor) -> torch.Tensor:
    """E4M3 (float8_e4m3fn) of fp32 ``scaled``: saturate to +-448, then RNE (torch's cast). NaN stays NaN."""
    return scaled.clamp(min=-E4M3_MAX, max=E4M3_MAX).to(torch.float8_e4m3fn)


# ----------------------------------------------------------------------------------------------
# Element rounding, values path (no codes; bit-identical to decoding the codes above)


def _e2m1_grid_step(magnitude: torch.Tensor) -> torch.Tensor:
    """Spacing of the E2M1 grid at |v| in [0, 6]: 0.5 below 2, 1 in [2, 4), 2 from 4 (fp32, new tensor).

    step = max(2^floor(log2 |v|), 1) / 2. 2^floor(log2 |v|) is |v| with its fp32 mantissa bits
    cleared (0 for zero and subnormal |v|, which the max lifts to 1; +Inf for NaN, so NaN stays NaN
    through |v| / step).
    """
    power_of_two = (magnitude.view(torch.int32) & 0x7F800000).view(torch.float32)
    return power_of_two.clamp_(min=1.0).mul_(0.5)


def _round_e2m1_magnitude_(
    magnitude: torch.Tensor, rounding: str, uniform: Optional[torch.Tensor]
) -> torch.Tensor:
    """|q|: the E2M1 grid value of fp32 |v| (>= 0 or NaN), saturated at 6. Overwrites ``magnitude``.

    nearest:    round_half_even(|v| / step) * step                    (torch.round: half to even)
    stochastic: (floor(|v| / step) + (u < frac)) * step,  frac = |v| / step - floor(|v| / step)
    Same ties as ``_round_e2m1``: 0.25 / 0.5 = 0.5 -> 0, 1.25 / 0.5 = 2.5 -> 2, 2.5 / 1 -> 2,
    5 / 2 = 2.5 -> 2 (so 4), ... |v| / step is exact; frac equals the codes path's
    (|v| - lo) * (1 / step) exactly; |v| = 6 gives frac = 0, so 6 never rounds up.
    """
    magnitude.clamp_(max=E2M1_MAX)  # NaN stays NaN
    step = _e2m1_grid_step(magnitude)
    units = magnitude.div_(step)  # |v| / step: exact, step is a power of two
    if rounding == "nearest":
        return units.round_().mul_(step)
    lower = units.floor()
    fraction = units.sub_(lower)  # exact: lower <= units < 2 * lower, or lower = 0
    rounds_up = uniform < fraction  # adds 1 where u < frac (not out=: torch.compile cannot trace that)
    return lower.add_(rounds_up).mul_(step)


def _e2m1_scaled_values(
    blocked: torch.Tensor,
    magnitude: torch.Tensor,
    block_scale: torch.Tensor,
    rounding: str,
    uniform: Optional[torch.Tensor],
) -> torch.Tensor:
    """q * s_b (fp32, blocked) from |v| = |x| * r_b (``magnitude``, overwritten) and the sign of x.

    ``blocked``: the fp32 input, blocked; ``block_scale``: fp32 s_b [R/tr, 1, C/tc, 1]. The sign of
    v = x * r_b is x's (r_b > 0; where r_b is NaN, s_b is NaN and so is the result).
    """
    values = _round_e2m1_magnitude_(magnitude, rounding, uniform)
    return values.copysign_(blocked).mul_(block_scale)


# ----------------------------------------------------------------------------------------------
# Scales (shared by both paths)


def nvfp4_global_scales(amax: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(S_enc, S_dec = 1/S_enc) from the fp32 tensor amax, TE's order; NaN for a non-finite amax."""
    device = amax.device
    encode = _fp32(E4M3_MAX * E2M1_MAX, device) / amax
    encode = torch.minimum(encode, _fp32(FLT_MAX, device))
    encode = torch.where((amax == 0) | (encode == 0), _fp32(1.0, device), encode)
    encode = torch.where(torch.isfinite(amax), encode, _fp32(float("nan"), device))
    decode = _fp32(1.0, device) / encode
    return encode, decode


def _nvfp4_scales(
    magnitude: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """From |x| blocked (fp32): s_b (float8_e4m3fn), r_b (fp32), both [R/tr, 1, C/tc, 1]; S_dec, amax (0-dim).

    The tensor amax is the max of the block amaxes (max is exact, NaN propagates).
    """
    device = magnitude.device
    block_amax = _block_max(magnitude)
    amax = block_amax.amax()
    encode, decode = nvfp4_global_scales(amax)
    block_scale = (block_amax * (encode * _fp32(1.0 / E2M1_MAX, device))).clamp(max=E4M3_MAX)
    block_scale = block_scale.to(torch.float8_e4m3fn)
    reciprocal = _fp32(1.0, device) / (block_scale.float() * decode)
    reciprocal = torch.minimum(reciprocal, _fp32(FLT_MAX, device))
    return block_scale, reciprocal, decode, amax


def _mx_scales(block_amax: torch.Tensor, fmt: str) -> torch.Tensor:
    """E8M0 block scales X (float8_e8m0fnu, shaped like ``block_amax``) from the fp32 block amax."""
    # floor(log2(amax)) = frexp exponent - 1 (frexp: amax = m * 2^e with m in [0.5, 1)); exact,
    # subnormals included.
    _, exponent = torch.frexp(block_amax)
    shared = (exponent - 1 - MX_ELEMENT_EMAX[fmt]).clamp(-E8M0_BIAS, E8M0_BIAS)
    shared = torch.where(block_amax == 0, torch.full_like(shared, -E8M0_BIAS), shared)
    scale_code = torch.where(
        torch.isfinite(block_amax), shared + E8M0_BIAS, torch.full_like(shared, E8M0_NAN_CODE)
    )
    return scale_code.to(torch.uint8).view(torch.float8_e8m0fnu)


def _fp8_scale_from_amax(amax, *, power_of_two: bool, value_for_inf: float):
    """TE's compute_scale_from_amax (epsilon 0) in fp32; returns (scale, decode scale = 1/scale).

    Deviation: a non-finite amax gives a NaN decode scale (TE: scale 1, which clips Inf).
    """
    device = amax.device
    one = _fp32(1.0, device)
    scale = _fp32(E4M3_MAX, device) / amax
    scale = torch.where(torch.isinf(scale), _fp32(value_for_inf, device), scale)
    scale = torch.where((amax == 0) | ~torch.isfinite(amax), one, scale)
    if power_of_two:
        # Clear the mantissa bits (sign and exponent kept): rounds down to a power of two.
        scale = (scale.view(torch.int32) & -0x800000).view(torch.float32)
    decode = one / scale
    decode = torch.where(torch.isfinite(amax), decode, _fp32(float("nan"), device))
    return scale, decode


# ----------------------------------------------------------------------------------------------
# Per format: codes (quantize) and values (quantize_scaled_values, fake_quantize)


class _Encoded(NamedTuple):
    """A format's codes path: what ``quantize`` stores in a QuantizedTensor (x2d's [rows, cols])."""

    codes: torch.Tensor
    block_scales: Optional[torch.Tensor]
    tensor_scale: Optional[torch.Tensor]
    amax: Optional[torch.Tensor] = None


# Every format's two paths take the same arguments: (x2d [rows, cols], resolved tile, rounding,
# uniforms or None, power_of_two_scales, input_max = the input dtype's largest finite value).


def _nvfp4_codes(x2d, tile, rounding, uniform, power_of_two_scales, input_max) -> _Encoded:
    blocked = _blocked_view(x2d.float(), tile)
    block_scale, reciprocal, decode, amax = _nvfp4_scales(blocked.abs())
    scaled = blocked * reciprocal
    codes = _round_e2m1(scaled, rounding, None if uniform is None else _blocked_view(uniform, tile))
    return _Encoded(codes, block_scale[:, 0, :, 0], decode, amax)


def _nvfp4_values(x2d, tile, rounding, uniform, power_of_two_scales, input_max):
    """(q * s_b fp32 blocked, S_dec) without codes."""
    blocked = _blocked_view(x2d.float(), tile)
    magnitude = blocked.abs()
    block_scale, reciprocal, decode, _ = _nvfp4_scales(magnitude)
    magnitude.mul_(reciprocal)  # |x| * r_b = |x * r_b|
    uniform = None if uniform is None else _blocked_view(uniform, tile)
    return _e2m1_scaled_values(blocked, magnitude, block_scale.float(), rounding, uniform), decode


def _mx_codes(fmt, x2d, tile, rounding, uniform, power_of_two_scales, input_max) -> _Encoded:
    blocked = _blocked_view(x2d.float(), tile)
    block_scale = _mx_scales(_block_amax(blocked), fmt)
    scaled = blocked / block_scale.float()  # division by a power of two (or NaN): exact
    if fmt == "mxfp4":
        codes = _round_e2m1(scaled, rounding, None if uniform is None else _blocked_view(uniform, tile))
    else:
        codes = _round_e4m3(scaled)
    return _Encoded(codes, block_scale[:, 0, :, 0], None)


def _mx_values(fmt, x2d, tile, rounding, uniform, power_of_two_scales, input_max):
    """(q * X fp32 blocked, None) without codes."""
    blocked = _blocked_view(x2d.float(), tile)
    magnitude = blocked.abs()
    scale = _mx_scales(_block_max(magnitude), fmt).float()
    if fmt == "mxfp8":
        return _round_e4m3(blocked / scale).float().mul_(scale), None
    magnitude.div_(scale)  # |x| / X = |x / X|
    uniform = None if uniform is None else _blocked_view(uniform, tile)
    return _e2m1_scaled_values(blocked, magnitude, scale, rounding, uniform), None


def _quantize_fp8_scaled(x2d, tile, power_of_two, value_for_inf):
    blocked = _blocked_view(x2d.float(), tile)
    amax = _block_amax(blocked)
    scale, decode = _fp8_scale_from_amax(amax, power_of_two=power_of_two, value_for_inf=value_for_inf)
    codes = _round_e4m3(blocked * scale)
    return codes, decode


def _fp8_block_codes(x2d, tile, rounding, uniform, power_of_two_scales, input_max) -> _Encoded:
    codes, decode = _quantize_fp8_scaled(x2d, tile, power_of_two_scales, input_max)
    return _Encoded(codes, decode[:, 0, :, 0], None)


def _fp8_block_values(x2d, tile, rounding, uniform, power_of_two_scales, input_max):
    codes, decode = _quantize_fp8_scaled(x2d, tile, power_of_two_scales, input_max)
    return codes.float().mul_(decode), None


def _fp8_tensor_codes(x2d, tile, rounding, uniform, power_of_two_scales, input_max) -> _Encoded:
    codes, decode = _quantize_fp8_scaled(x2d, None, False, FLT_MAX)
    return _Encoded(codes, None, decode.reshape(()))


def _fp8_tensor_values(x2d, tile, rounding, uniform, power_of_two_scales, input_max):
    """(q fp32, S_dec): no block scale, the per-tensor decode scale is applied by the caller."""
    codes, decode = _quantize_fp8_scaled(x2d, None, False, FLT_MAX)
    return codes.float(), decode.reshape(())


class _ElementQuantizer(NamedTuple):
    """One element format's two torch paths (the reference the Triton kernels are tested against)."""

    codes: Callable[..., _Encoded]
    """-> codes, block scales, per-tensor decode scale, amax: what quantize() stores."""
    values: Callable[..., Tuple[torch.Tensor, Optional[torch.Tensor]]]
    """-> (q * s_b fp32, per-tensor decode scale or None), bit for bit the codes path's values."""


QUANTIZERS = {
    "nvfp4": _ElementQuantizer(_nvfp4_codes, _nvfp4_values),
    "mxfp4": _ElementQuantizer(partial(_mx_codes, "mxfp4"), partial(_mx_values, "mxfp4")),
    "mxfp8": _ElementQuantizer(partial(_mx_codes, "mxfp8"), partial(_mx_values, "mxfp8")),
    "fp8_block": _ElementQuantizer(_fp8_block_codes, _fp8_block_values),
    "fp8_tensor": _ElementQuantizer(_fp8_tensor_codes, _fp8_tensor_values),
}
"""Element format -> its quantize functions: one entry per ``OPERAND_FORMATS`` name of the registry
(a new element format adds its registry entry and its entry here; tests check the two agree)."""


# ----------------------------------------------------------------------------------------------
# Public API


def _checked_tile(x: torch.Tensor, fmt: str, tile, rounding: str, name: Optional[str]):
    """Validate the arguments of quantize() and friends; return the resolved tile."""
    tile = resolve_tile(fmt, tile)
    if rounding not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}; expected one of {ROUNDINGS}")
    if rounding == "stochastic" and fmt not in E2M1_FORMATS:
        raise ValueError(f"stochastic rounding is implemented for E2M1 formats {E2M1_FORMATS}, not {fmt!r}")
    if x.dtype not in _INPUT_DTYPES:
        where = f"{name}: " if name else ""
        raise TypeError(f"{where}cannot quantize dtype {x.dtype}; expected one of {_INPUT_DTYPES}")
    check_blockable(x.shape, fmt, tile, name=name)
    return tile


def _input_max(x: torch.Tensor) -> float:
    """The input dtype's largest finite value (fp8_block maps an infinite block amax to it, as TE does)."""
    return float(torch.finfo(x.dtype).max)


def _uniforms(x2d: torch.Tensor, rounding: str, generator) -> Optional[torch.Tensor]:
    """One uniform per element for stochastic rounding, torch.rand(rows, cols) row-major; else None."""
    if rounding != "stochastic":
        return None
    return torch.rand(x2d.shape, generator=generator, device=x2d.device, dtype=torch.float32)


def _laid_out_like(tensor: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Row-major 2D ``tensor``, copied to column-major if ``like`` (same shape) is column-major.

    The uniforms are drawn row-major over the operand; for a transposed (column-major) operand one
    transposing copy up front is much cheaper than mixing the two memory orders in every later op.
    """
    if like.is_contiguous() or not like.t().is_contiguous():
        return tensor
    return tensor.t().contiguous().t()


def quantize(
    x: torch.Tensor,
    fmt: str,
    *,
    tile=None,
    rounding: str = "nearest",
    generator: Optional[torch.Generator] = None,
    power_of_two_scales: bool = True,
    name: Optional[str] = None,
) -> QuantizedTensor:
    """Quantize ``x`` (fp32/bf16/fp16, any shape, blocks along the last dim) to ``fmt``.

    ``tile``: None for the format's default, else one of its ``FormatSpec.allowed_tiles`` (format_registry).
    ``rounding``: "nearest" (RNE) or "stochastic" (E2M1 formats; uniforms from ``generator``,
    torch's global RNG when None). ``power_of_two_scales``: fp8_block only. ``name`` (e.g. the
    layer) prefixes shape errors.
    """
    tile = _checked_tile(x, fmt, tile, rounding, name)
    x2d = x.reshape(-1, x.shape[-1])
    uniform = _uniforms(x2d, rounding, generator)

    encoded = QUANTIZERS[fmt].codes(x2d, tile, rounding, uniform, power_of_two_scales, _input_max(x))
    return QuantizedTensor(
        fmt=fmt,
        codes=encoded.codes.reshape(x2d.shape),
        block_scales=encoded.block_scales,
        tensor_scale=encoded.tensor_scale,
        tile=tile,
        shape=x.shape,
        dtype=x.dtype,
        power_of_two_scales=(fmt == "fp8_block" and power_of_two_scales),
        amax=encoded.amax,
    )


def _scaled_values_fp32(
    x: torch.Tensor, fmt: str, tile, rounding: str, generator, power_of_two_scales: bool
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(q * s_b as fp32 [rows, cols], per-tensor decode scale or None): the values path of quantize()."""
    x2d = x.reshape(-1, x.shape[-1])
    uniform = _uniforms(x2d, rounding, generator)
    if uniform is not None:
        uniform = _laid_out_like(uniform, x2d)
    values, tensor_scale = QUANTIZERS[fmt].values(x2d, tile, rounding, uniform, power_of_two_scales, _input_max(x))
    return values.reshape(x2d.shape), tensor_scale


def quantize_scaled_values(
    x: torch.Tensor,
    fmt: str,
    *,
    tile=None,
    rounding: str = "nearest",
    generator: Optional[torch.Generator] = None,
    power_of_two_scales: bool = True,
    name: Optional[str] = None,
    dtype: torch.dtype = torch.bfloat16,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(q * s_b in ``dtype`` and x's shape, per-tensor decode scale or None), without element codes.

    Bit for bit ``(q.scaled_values(dtype), q.tensor_scale)`` of ``q = quantize(x, ...)`` with the
    same arguments (and, for stochastic rounding, the same uniform draws from ``generator``); what
    an emulated GEMM needs. Keeps x's memory order (a transposed x gives a transposed result).
    """
    tile = _checked_tile(x, fmt, tile, rounding, name)
    values, tensor_scale = _scaled_values_fp32(x, fmt, tile, rounding, generator, power_of_two_scales)
    return values.reshape(x.shape).to(dtype), tensor_scale


def fake_quantize(
    x: torch.Tensor,
    fmt: str,
    *,
    tile=None,
    rounding: str = "nearest",
    generator: Optional[torch.Generator] = None,
    power_of_two_scales: bool = True,
    name: Optional[str] = None,
) -> torch.Tensor:
    """``quantize(x, ...).dequantize()`` bit for bit (x's shape and dtype), computed without codes."""
    tile = _checked_tile(x, fmt, tile, rounding, name)
    values, tensor_scale = _scaled_values_fp32(x, fmt, tile, rounding, generator, power_of_two_scales)
    if tensor_scale is not None:
        values = values.mul_(tensor_scale)  # (q * s_b) * S_dec, as dequantize() orders it
    return values.reshape(x.shape).to(x.dtype)
