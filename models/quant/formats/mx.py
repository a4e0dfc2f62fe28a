"""MXFP4 / MXFP8 (OCP Microscaling Formats v1.0, section 6.3): E2M1 / E4M3 elements, E8M0 block scales.

    X       = 2 ** clamp(floor(log2(block_amax)) - emax_elem, -127, 127)     emax_elem = 2 (E2M1), 8 (E4M3)
    q       = element(x / X)                               RNE, saturating (6 or 448)
    x_hat   = q * X
An all-zero block takes the smallest scale, 2^-127 (microxcaling's convention). tile (1, 32).
TE's own MXFP8 rounds amax/448 *up* to a power of two (so nothing saturates); this follows the OCP
spec.
"""

from __future__ import annotations

import torch

import models.quant.formats.elements as elements  # the sibling itself, not through the package's __init__
from models.quant.formats.blocking import block_amax, block_max, blocked_view
from models.quant.formats.elements import round_e4m3
from models.quant.formats.quantized_tensor import Encoded

MX_ELEMENT_EMAX = {"mxfp4": 2, "mxfp8": 8}
"""Largest exponent of the element format (emax_elem in the OCP MX spec)."""
E8M0_BIAS = 127
E8M0_NAN_CODE = 255

# Every format's two paths take the same arguments: (x2d [rows, cols], resolved tile, rounding,
# uniforms or None, power_of_two_scales, input_max = the input dtype's largest finite value); the
# codes path returns an ``Encoded``, the values path (q * s_b fp32 blocked, per-tensor decode or None).


def mx_scales(block_amax: torch.Tensor, fmt: str) -> torch.Tensor:
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


def codes(fmt, x2d, tile, rounding, uniform, power_of_two_scales, input_max) -> Encoded:
    blocked = blocked_view(x2d.float(), tile)
    block_scale = mx_scales(block_amax(blocked), fmt)
    scaled = blocked / block_scale.float()  # division by a power of two (or NaN): exact
    if fmt == "mxfp4":
        codes = elements.round_e2m1(scaled, rounding, None if uniform is None else blocked_view(uniform, tile))
    else:
        codes = round_e4m3(scaled)
    return Encoded(codes, block_scale[:, 0, :, 0], None)


def values(fmt, x2d, tile, rounding, uniform, power_of_two_scales, input_max):
    """(q * X fp32 blocked, None) without codes."""
    blocked = blocked_view(x2d.float(), tile)
    magnitude = blocked.abs()
    scale = mx_scales(block_max(magnitude), fmt).float()
    if fmt == "mxfp8":
        return round_e4m3(blocked / scale).float().mul_(scale), None
    magnitude.div_(scale)  # |x| / X = |x / X|
    uniform = None if uniform is None else blocked_view(uniform, tile)
    return elements.e2m1_scaled_values(blocked, magnitude, scale, rounding, uniform), None
