"""NVFP4 (Transformer Engine ``core_nvfp4.cuh``): E2M1 elements, E4M3 block scales, an fp32 tensor scale.

    amax    = max |x| over the tensor
    S_enc   = min(448 * 6 / amax, FLT_MAX);  S_enc = 1 if amax == 0 or S_enc == 0
    s_b     = e4m3(block_amax * (S_enc * (1/6)))          RNE, saturating at 448
    r_b     = min(1 / (fp32(s_b) * (1 / S_enc)), FLT_MAX)
    q       = e2m1(x * r_b)                                RNE or stochastic, saturating at 6
    x_hat   = q * fp32(s_b) * (1 / S_enc)
tiles (1, 16) (default) or (16, 16) (one scale per 16x16 tile, "2D").

``nvfp4_ue5m3`` (arXiv 2509.17791: UE5M3 block scales in place of E4M3) is the same with
s_b = ue5m3(...) (``elements.round_ue5m3``) and 448 replaced by UE5M3's largest value, 114688, in
S_enc: the largest block still maps to the largest scale, and the scales reach 2^-17 of it instead
of E4M3's 2^-9 (2^-14 instead of 2^-6 at full precision), with E4M3's 3 mantissa bits. Its block
scales are stored as their fp32 values (every UE5M3 value is one).
"""

from __future__ import annotations

from typing import Tuple

import torch

from models.quant.element_formats import E2M1_MAX, E4M3_MAX, UE5M3_MAX
import models.quant.formats.elements as elements  # the sibling itself, not through the package's __init__
from models.quant.formats.blocking import block_max, blocked_view
from models.quant.formats.elements import FLT_MAX, fp32
from models.quant.formats.quantized_tensor import Encoded

SCALE_BOUNDS = {"nvfp4": E4M3_MAX, "nvfp4_ue5m3": UE5M3_MAX}
"""Element format -> the block scale the tensor amax maps to (S_enc = bound * 6 / amax)."""

# Every format's two paths take the same arguments: (x2d [rows, cols], resolved tile, rounding,
# uniforms or None, power_of_two_scales, input_max = the input dtype's largest finite value); the
# codes path returns an ``Encoded``, the values path (q * s_b fp32 blocked, per-tensor decode or None).


def nvfp4_global_scales(amax: torch.Tensor, bound: float = E4M3_MAX) -> Tuple[torch.Tensor, torch.Tensor]:
    """(S_enc, S_dec = 1/S_enc) from the fp32 tensor amax, TE's order; NaN for a non-finite amax.

    ``bound``: the block scale the amax maps to (``fp32(bound * 6)`` is exact for every bound used).
    """
    device = amax.device
    encode = fp32(bound * E2M1_MAX, device) / amax
    encode = torch.minimum(encode, fp32(FLT_MAX, device))
    encode = torch.where((amax == 0) | (encode == 0), fp32(1.0, device), encode)
    encode = torch.where(torch.isfinite(amax), encode, fp32(float("nan"), device))
    decode = fp32(1.0, device) / encode
    return encode, decode


def block_reciprocal(block_scale: torch.Tensor, decode: torch.Tensor) -> torch.Tensor:
    """r_b = min(1 / (fp32(s_b) * S_dec), FLT_MAX) for fp32 ``block_scale``."""
    reciprocal = fp32(1.0, block_scale.device) / (block_scale * decode)
    return torch.minimum(reciprocal, fp32(FLT_MAX, block_scale.device))


def nvfp4_scales(
    magnitude: torch.Tensor, fmt: str = "nvfp4",
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """From |x| blocked (fp32): s_b, r_b (fp32), both [R/tr, 1, C/tc, 1]; S_dec, amax (0-dim).

    s_b is float8_e4m3fn for nvfp4, its fp32 value for nvfp4_ue5m3. The tensor amax is the max of
    the block amaxes (max is exact, NaN propagates).
    """
    device = magnitude.device
    block_amax = block_max(magnitude)
    amax = block_amax.amax()
    encode, decode = nvfp4_global_scales(amax, SCALE_BOUNDS[fmt])
    unrounded = block_amax * (encode * fp32(1.0 / E2M1_MAX, device))
    if fmt == "nvfp4_ue5m3":
        block_scale = elements.round_ue5m3(unrounded)
        scale_values = block_scale
    else:
        block_scale = unrounded.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
        scale_values = block_scale.float()
    return block_scale, block_reciprocal(scale_values, decode), decode, amax


def codes(x2d, tile, rounding, uniform, power_of_two_scales, input_max, fmt: str = "nvfp4") -> Encoded:
    blocked = blocked_view(x2d.float(), tile)
    block_scale, reciprocal, decode, amax = nvfp4_scales(blocked.abs(), fmt)
    scaled = blocked * reciprocal
    codes = elements.round_e2m1(scaled, rounding, None if uniform is None else blocked_view(uniform, tile))
    return Encoded(codes, block_scale[:, 0, :, 0], decode, amax)


def values(x2d, tile, rounding, uniform, power_of_two_scales, input_max, fmt: str = "nvfp4"):
    """(q * s_b fp32 blocked, S_dec) without codes."""
    blocked = blocked_view(x2d.float(), tile)
    magnitude = blocked.abs()
    block_scale, reciprocal, decode, _ = nvfp4_scales(magnitude, fmt)
    magnitude.mul_(reciprocal)  # |x| * r_b = |x * r_b|
    uniform = None if uniform is None else blocked_view(uniform, tile)
    return elements.e2m1_scaled_values(blocked, magnitude, block_scale.float(), rounding, uniform), decode
