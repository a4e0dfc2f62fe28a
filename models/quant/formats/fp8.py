"""Blockwise and per-tensor FP8 (E4M3 elements, fp32 scales).

fp8_block (TE ``Float8BlockScaling``: ``recipe_common.cuh: compute_scale_from_amax``; one fp32
scale per 1x128 (default) or 128x128 tile)
    scale   = 1 if block_amax == 0, else 448 / block_amax
    scale   = max finite value of the input dtype if that overflowed to inf
    scale   = scale with its mantissa bits cleared (power of two, rounded down) if power_of_two_scales
    q       = e4m3(x * scale)                              RNE, saturating
    x_hat   = q * (1 / scale)                              (1/scale is what TE stores: scale_inv)

fp8_tensor (TE ``Float8CurrentScaling``: one fp32 scale per tensor)
    scale   = 448 / amax (1 if amax == 0; FLT_MAX if it overflowed); q = e4m3(x * scale);
    x_hat   = q * (1 / scale)
"""

from __future__ import annotations

import torch

from models.quant.element_formats import E4M3_MAX
from models.quant.formats.blocking import block_amax, blocked_view
from models.quant.formats.elements import FLT_MAX, fp32, round_e4m3
from models.quant.formats.quantized_tensor import Encoded

# Every format's two paths take the same arguments: (x2d [rows, cols], resolved tile, rounding,
# uniforms or None, power_of_two_scales, input_max = the input dtype's largest finite value); the
# codes path returns an ``Encoded``, the values path (q * s_b fp32 blocked, per-tensor decode or None).


def fp8_scale_from_amax(amax, *, power_of_two: bool, value_for_inf: float):
    """TE's compute_scale_from_amax (epsilon 0) in fp32; returns (scale, decode scale = 1/scale).

    Deviation: a non-finite amax gives a NaN decode scale (TE: scale 1, which clips Inf).
    """
    device = amax.device
    one = fp32(1.0, device)
    scale = fp32(E4M3_MAX, device) / amax
    scale = torch.where(torch.isinf(scale), fp32(value_for_inf, device), scale)
    scale = torch.where((amax == 0) | ~torch.isfinite(amax), one, scale)
    if power_of_two:
        # Clear the mantissa bits (sign and exponent kept): rounds down to a power of two.
        scale = (scale.view(torch.int32) & -0x800000).view(torch.float32)
    decode = one / scale
    decode = torch.where(torch.isfinite(amax), decode, fp32(float("nan"), device))
    return scale, decode


def quantize_fp8_scaled(x2d, tile, power_of_two, value_for_inf):
    blocked = blocked_view(x2d.float(), tile)
    amax = block_amax(blocked)
    scale, decode = fp8_scale_from_amax(amax, power_of_two=power_of_two, value_for_inf=value_for_inf)
    codes = round_e4m3(blocked * scale)
    return codes, decode


def block_codes(x2d, tile, rounding, uniform, power_of_two_scales, input_max) -> Encoded:
    codes, decode = quantize_fp8_scaled(x2d, tile, power_of_two_scales, input_max)
    return Encoded(codes, decode[:, 0, :, 0], None)


def block_values(x2d, tile, rounding, uniform, power_of_two_scales, input_max):
    codes, decode = quantize_fp8_scaled(x2d, tile, power_of_two_scales, input_max)
    return codes.float().mul_(decode), None


def tensor_codes(x2d, tile, rounding, uniform, power_of_two_scales, input_max) -> Encoded:
    codes, decode = quantize_fp8_scaled(x2d, None, False, FLT_MAX)
    return Encoded(codes, None, decode.reshape(()))


def tensor_values(x2d, tile, rounding, uniform, power_of_two_scales, input_max):
    """(q fp32, S_dec): no block scale, the per-tensor decode scale is applied by the caller."""
    codes, decode = quantize_fp8_scaled(x2d, None, False, FLT_MAX)
    return codes.float(), decode.reshape(())
