"""Block-scaled low-precision formats: quantize and dequantize, emulated bit for bit in fp32.

The torch reference of every format, and what the Triton kernels (``models.quant.kernels``) are
tested against. Every tensor is treated as 2D: leading dims are flattened into rows, blocks
(tiles) run along the last dim unless a 2D tile says otherwise. A dim that does not divide the
tile raises ValueError; nothing is ever padded. All arithmetic is fp32, in the order each format's
module writes down:

- ``nvfp4``: E2M1 elements, E4M3 block scales (1x16 or 16x16), fp32 tensor scale (TE
  ``core_nvfp4.cuh``); ``nvfp4_ue5m3``: the same with UE5M3 block scales; ``four_over_six``: nvfp4
  whose blocks choose between scaling their max to 4 or to 6 (``quantize(..., four_over_six="mse")``);
- ``mx``: mxfp4 / mxfp8, E2M1 / E4M3 elements, E8M0 scales per 1x32 block (OCP MX v1.0);
- ``fp8``: fp8_block (1x128 / 128x128 fp32 scales, TE ``Float8BlockScaling``) and fp8_tensor (one
  fp32 scale, TE ``Float8CurrentScaling``);
- ``elements``: E2M1 and E4M3 rounding; ``blocking``: tiles and block maxima;
  ``quantized_tensor``: the stored codes and scales and their decodings.

nvfp4's x_hat is *our* dequantization (``QuantizedTensor.dequantize``), the order the emulated GEMM
uses: q * s_b, then the per-tensor decode scale (TE's cuBLAS GEMM instead scales its output by
alpha = amax_a * amax_b * fp32(1 / (36 * 448^2)), recipe/nvfp4.cu). Two places where TE's
quantize/dequantize code differs from this package (docs/numerics.md, "NVFP4 and TE: where the bits
differ"):
- TE's standalone dequantize kernel (``dequantize_nvfp4.cuh``, ``dequantize_fp4_kernel``) reads the
  stored amax, not 1/S_enc:  x_te = q * ((fp32(s_b) * amax) * fp32(1 / (6 * 448))), one rounding
  per product. That factor differs from fp32(s_b) * (1/S_enc) in the last bit(s) for many blocks
  (up to a few fp32 ulp). ``QuantizedTensor.dequantize_te_standalone`` computes TE's order.
- A scaled value x * r_b of -0.0 (an input of -0.0) gets E2M1 code 8 (-0) here, as ml_dtypes'
  cast does; TE's pure-torch reference (``NVFP4QuantizerRef``, ``cast_to_fp4x2``) stores code 0
  (+0). Negative values that round to zero get code 8 in both. Decoded, -0.0 == +0.0, so GEMM
  sums are unchanged. The encoder is left as it is: the Triton kernels match it bit for bit.

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

Two paths, bit-identical (``elements``): ``quantize`` builds the element codes;
``quantize_scaled_values`` / ``fake_quantize`` need only the values q * s_b and never build codes.

Sources: TE ``transformer_engine/common/cast/nvfp4/core_nvfp4.cuh``,
``transformer_engine/common/cast/nvfp4/dequantize_nvfp4.cuh`` (standalone dequantize),
``transformer_engine/common/recipe/recipe_common.cuh``, ``transformer_engine/common/recipe/
current_scaling.cu``, ``transformer_engine/pytorch/custom_recipes/quantization_nvfp4.py`` and
``reference_nvfp4.py`` (reference quantizer, ``cast_to_fp4x2``), OCP MX v1.0 spec. The tests check
every format element by element against ml_dtypes.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, NamedTuple, Optional, Tuple

import torch

from models.quant.element_formats import (  # noqa: F401 - re-exported: formats.resolve_tile etc.
    E2M1_FORMATS,
    E2M1_MAX,
    E4M3_MAX,
    OPERAND_FORMATS,
    ROUNDINGS,
    UE5M3_MAX,
    resolve_tile,
)
from models.quant.formats import four_over_six as four_over_six_format
from models.quant.formats import fp8, mx, nvfp4
from models.quant.formats.blocking import blockable, check_blockable  # noqa: F401 - re-exported
from models.quant.formats.elements import E2M1_GRID, FLT_MAX  # noqa: F401 - re-exported
from models.quant.formats.four_over_six import FOUR_OVER_SIX_BOUND, FOUR_OVER_SIX_ERRORS  # noqa: F401 - re-exported
from models.quant.formats.mx import E8M0_BIAS, E8M0_NAN_CODE, MX_ELEMENT_EMAX  # noqa: F401 - re-exported
from models.quant.formats.nvfp4 import nvfp4_global_scales  # noqa: F401 - re-exported
from models.quant.formats.quantized_tensor import Encoded, QuantizedTensor

FORMATS = OPERAND_FORMATS
"""The element formats this package quantizes."""

_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class _ElementQuantizer(NamedTuple):
    """One element format's two torch paths (the reference the Triton kernels are tested against)."""

    codes: Callable[..., Encoded]
    """-> codes, block scales, per-tensor decode scale, amax: what quantize() stores."""
    values: Callable[..., Tuple[torch.Tensor, Optional[torch.Tensor]]]
    """-> (q * s_b fp32, per-tensor decode scale or None), bit for bit the codes path's values."""


QUANTIZERS = {
    "nvfp4": _ElementQuantizer(nvfp4.codes, nvfp4.values),
    "nvfp4_ue5m3": _ElementQuantizer(partial(nvfp4.codes, fmt="nvfp4_ue5m3"), partial(nvfp4.values, fmt="nvfp4_ue5m3")),
    "mxfp4": _ElementQuantizer(partial(mx.codes, "mxfp4"), partial(mx.values, "mxfp4")),
    "mxfp8": _ElementQuantizer(partial(mx.codes, "mxfp8"), partial(mx.values, "mxfp8")),
    "fp8_block": _ElementQuantizer(fp8.block_codes, fp8.block_values),
    "fp8_tensor": _ElementQuantizer(fp8.tensor_codes, fp8.tensor_values),
}
"""Element format -> its quantize functions: one entry per element format of
``models.quant.element_formats`` (a new element format adds its ``ElementFormat`` and its entry
here; tests check the two agree)."""


# ----------------------------------------------------------------------------------------------
# Public API


FOUR_OVER_SIX_FORMATS = ("nvfp4",)
"""The element formats Four Over Six applies to (its bound 256 and map-to-4 factor are E4M3's)."""


def _checked_tile(x: torch.Tensor, fmt: str, tile, rounding: str, name: Optional[str], four_over_six=None):
    """Validate the arguments of quantize() and friends; return the resolved tile."""
    tile = resolve_tile(fmt, tile)
    if four_over_six is not None:
        if fmt not in FOUR_OVER_SIX_FORMATS:
            raise ValueError(f"four_over_six applies to {FOUR_OVER_SIX_FORMATS}, not {fmt!r}")
        if four_over_six not in FOUR_OVER_SIX_ERRORS:
            raise ValueError(f"four_over_six must be one of {FOUR_OVER_SIX_ERRORS}, got {four_over_six!r}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}; expected one of {ROUNDINGS}")
    if rounding == "stochastic" and fmt not in E2M1_FORMATS:
        raise ValueError(f"stochastic rounding is implemented for E2M1 formats {E2M1_FORMATS}, not {fmt!r}")
    if x.dtype not in _INPUT_DTYPES:
        where = f"{name}: " if name else ""
        raise TypeError(f"{where}cannot quantize dtype {x.dtype}; expected one of {_INPUT_DTYPES}")
    check_blockable(x.shape, fmt, tile, name=name)
    return tile


def _quantizer(fmt: str, four_over_six: Optional[str]) -> _ElementQuantizer:
    """The codes and values paths of ``fmt``, or of Four Over Six with that candidate error."""
    if four_over_six is None:
        return QUANTIZERS[fmt]
    return _ElementQuantizer(*four_over_six_format.quantizer(four_over_six))


def _input_max(x: torch.Tensor) -> float:
    """The input dtype's largest finite value (fp8_block maps an infinite block amax to it, as TE does)."""
    return float(torch.finfo(x.dtype).max)


def _uniforms(x2d: torch.Tensor, rounding: str, generator, given: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """One uniform per element for stochastic rounding: ``given``, else torch.rand(rows, cols)
    row-major; None for round to nearest."""
    if given is not None:
        if rounding != "stochastic" or given.shape != x2d.shape or given.dtype != torch.float32 \
                or given.device != x2d.device:
            raise ValueError(f"uniform must be fp32 {list(x2d.shape)} on {x2d.device} with rounding='stochastic', got "
                             f"{given.dtype} {list(given.shape)} on {given.device} with rounding={rounding!r}")
        return given
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
    uniform: Optional[torch.Tensor] = None,
    four_over_six: Optional[str] = None,
) -> QuantizedTensor:
    """Quantize ``x`` (fp32/bf16/fp16, any shape, blocks along the last dim) to ``fmt``.

    ``tile``: None for the format's default, else one of its ``ElementFormat.allowed_tiles``.
    ``rounding``: "nearest" (RNE) or "stochastic" (E2M1 formats; uniforms from ``generator``,
    torch's global RNG when None, or ``uniform``: fp32 [rows, cols] of x's 2D view, one per
    element, for a reference that rounds with given draws). ``power_of_two_scales``: fp8_block
    only. ``name`` (e.g. the layer) prefixes shape errors. ``four_over_six``: nvfp4 only, None (every
    block max maps to 6) or the candidate error, "mse" or "mae" (``formats.four_over_six``).
    """
    tile = _checked_tile(x, fmt, tile, rounding, name, four_over_six)
    x2d = x.reshape(-1, x.shape[-1])
    uniform = _uniforms(x2d, rounding, generator, uniform)

    encoded = _quantizer(fmt, four_over_six).codes(x2d, tile, rounding, uniform, power_of_two_scales, _input_max(x))
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
        scale_bound=FOUR_OVER_SIX_BOUND if four_over_six is not None else nvfp4.SCALE_BOUNDS.get(fmt, E4M3_MAX),
    )


def _scaled_values_fp32(
    x: torch.Tensor, fmt: str, tile, rounding: str, generator, power_of_two_scales: bool, four_over_six=None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(q * s_b as fp32 [rows, cols], per-tensor decode scale or None): the values path of quantize()."""
    x2d = x.reshape(-1, x.shape[-1])
    uniform = _uniforms(x2d, rounding, generator, None)
    if uniform is not None:
        uniform = _laid_out_like(uniform, x2d)
    values, tensor_scale = _quantizer(fmt, four_over_six).values(x2d, tile, rounding, uniform, power_of_two_scales,
                                                                 _input_max(x))
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
    four_over_six: Optional[str] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(q * s_b in ``dtype`` and x's shape, per-tensor decode scale or None), without element codes.

    Bit for bit ``(q.scaled_values(dtype), q.tensor_scale)`` of ``q = quantize(x, ...)`` with the
    same arguments (and, for stochastic rounding, the same uniform draws from ``generator``); what
    an emulated GEMM needs. Keeps x's memory order (a transposed x gives a transposed result).
    """
    tile = _checked_tile(x, fmt, tile, rounding, name, four_over_six)
    values, tensor_scale = _scaled_values_fp32(x, fmt, tile, rounding, generator, power_of_two_scales, four_over_six)
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
    four_over_six: Optional[str] = None,
) -> torch.Tensor:
    """``quantize(x, ...).dequantize()`` bit for bit (x's shape and dtype), computed without codes."""
    tile = _checked_tile(x, fmt, tile, rounding, name, four_over_six)
    values, tensor_scale = _scaled_values_fp32(x, fmt, tile, rounding, generator, power_of_two_scales, four_over_six)
    if tensor_scale is not None:
        values = values.mul_(tensor_scale)  # (q * s_b) * S_dec, as dequantize() orders it
    return values.reshape(x.shape).to(x.dtype)
