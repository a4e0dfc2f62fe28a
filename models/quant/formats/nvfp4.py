"""NVFP4 (Transformer Engine ``core_nvfp4.cuh``): E2M1 elements, E4M3 block scales, an fp32 tensor scale.

    amax    = max |x| over the tensor
    S_enc   = min(448 * 6 / amax, FLT_MAX);  S_enc = 1 if amax == 0 or S_enc == 0
    s_b     = e4m3(block_amax * (S_enc * (1/6)))          RNE, saturating at 448
    r_b     = min(1 / (fp32(s_b) * (1 / S_enc)), FLT_MAX)
    q       = e2m1(x * r_b)                                RNE or stochastic, saturating at 6
    x_hat   = q * fp32(s_b) * (1 / S_enc)
tiles (1, 16) (default) or (16, 16) (one scale per 16x16 tile, "2D").
"""

from __future__ import annotations

from typing import Tuple

import torch

from models.quant.element_formats import E2M1_MAX, E4M3_MAX
from models.quant.formats import elements
from models.quant.formats.blocking import block_max, blocked_view
from models.quant.formats.elements import FLT_MAX, fp32
from models.quant.formats.quantized_tensor import Encoded

# Every format's two paths take the same arguments: (x2d [rows, cols], resolved tile, rounding,
# uniforms or None, power_of_two_scales, input_max = the input dtype's largest finite value); the
# codes path returns an ``Encoded``, the values path (q * s_b fp32 blocked, per-tensor decode or None).


def nvfp4_global_scales(amax: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(S_enc, S_dec = 1/S_enc) from the fp32 tensor amax, TE's order; NaN for a non-finite amax."""
    device = amax.device
    encode = fp32(E4M3_MAX * E2M1_MAX, device) / amax
    encode = torch.minimum(encode, fp32(FLT_MAX, device))
    encode = torch.where((amax == 0) | (encode == 0), fp32(1.0, device), encode)
    encode = torch.where(torch.isfinite(amax), encode, fp32(float("nan"), device))
    decode = fp32(1.0, device) / encode
    return encode, decode


def nvfp4_scales(
    magnitude: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """From |x| blocked (fp32): s_b (float8_e4m3fn), r_b (fp32), both [R/tr, 1, C/tc, 1]; S_dec, amax (0-dim).

    The tensor amax is the max of the block amaxes (max is exact, NaN propagates).
    """
    device = magnitude.device
    block_amax = block_max(magnitude)
    amax = block_amax.amax()
    encode, decode = nvfp4_global_scales(amax)
    block_scale = (block_amax * (encode * fp32(1.0 / E2M1_MAX, device))).clamp(max=E4M3_MAX)
    block_scale = block_scale.to(torch.float8_e4m3fn)
    reciprocal = fp32(1.0, device) / (block_scale.float() * decode)
    reciprocal = torch.minimum(reciprocal, fp32(FLT_MAX, device))
    return block_scale, reciprocal, decode, amax


def codes(x2d, tile, rounding, uniform, power_of_two_scales, input_max) -> Encoded:
    blocked = blocked_view(x2d.float(), tile)
    block_scale, reciprocal, decode, amax = nvfp4_scales(blocked.abs())
    scaled = blocked * reciprocal
    codes = elements.round_e2m1(scaled, rounding, None if uniform is None else blocked_view(uniform, tile))
    return Encoded(codes, block_scale[:, 0, :, 0], decode, amax)


def values(x2d, tile, rounding, uniform, power_of_two_scales, input_max):
    """(q * s_b fp32 blocked, S_dec) without codes."""
    blocked = blocked_view(x2d.float(), tile)
    magnitude = blocked.abs()
    block_scale, reciprocal, decode, _ = nvfp4_scales(magnitude)
    magnitude.mul_(reciprocal)  # |x| * r_b = |x * r_b|
    uniform = None if uniform is None else blocked_view(uniform, tile)
    return elements.e2m1_scaled_values(blocked, magnitude, block_scale.float(), rounding, uniform), decode
