"""Element rounding: E2M1 (codes path and values path), E4M3 and UE5M3, in fp32.

Two paths, bit-identical (the tests check it on every format, ties, zeros, subnormal scales and
NaN/Inf included):
- ``round_e2m1`` builds the element codes (storage, packing, tests) by threshold comparisons; they
  decode through ``E2M1_GRID``: the reference.
- ``round_e2m1_magnitude_`` / ``e2m1_scaled_values`` give only the values q * s_b (what an emulated
  GEMM multiplies), rounding arithmetically without codes (formulas in its docstring).
E4M3 elements are the same cast in both paths (``round_e4m3``).
"""

from __future__ import annotations

from typing import Optional

import torch

from models.quant.element_formats import E2M1_MAX, E4M3_MAX, UE5M3_MAX

FLT_MAX = torch.finfo(torch.float32).max
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""E2M1 magnitudes by code (bits s e e m: code & 7 indexes this table, code & 8 is the sign)."""


def fp32(value: float, device) -> torch.Tensor:
    """A 0-dim fp32 constant: keeps every scalar op in fp32, as the CUDA code does."""
    return torch.tensor(value, dtype=torch.float32, device=device)


# ----------------------------------------------------------------------------------------------
# Codes path (the reference: what quantize() stores)


def round_e2m1(
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


def round_e4m3(scaled: torch.Tensor) -> torch.Tensor:
    """E4M3 (float8_e4m3fn) of fp32 ``scaled``: saturate to +-448, then RNE (torch's cast). NaN stays NaN."""
    return scaled.clamp(min=-E4M3_MAX, max=E4M3_MAX).to(torch.float8_e4m3fn)


# UE5M3: an unsigned 8-bit scale, 5 exponent bits (bias 15) and 3 mantissa bits. Code e m (e = code >> 3,
# m = code & 7): e = 0 is subnormal, m * 2^-17; else 2^(e - 15) * (1 + m / 8); 0xFF is NaN and there is no
# infinity, so the largest value is 0xFE = 2^16 * 1.75 = 114688. These are E4M3's conventions (OCP OFP8,
# "fn": no infinities, the all-ones code is NaN) on a byte without a sign bit, whose freed bit widens
# the exponent: E4M3's 2^-9 .. 448 becomes 2^-17 .. 114688 at the same 3-bit precision.
UE5M3_MIN_NORMAL = 2.0 ** -14
UE5M3_NAN_CODE = 0xFF


def round_ue5m3(value: torch.Tensor) -> torch.Tensor:
    """UE5M3 of fp32 ``value`` >= 0 (or NaN), as fp32: saturate at 114688, then RNE to 3 mantissa bits.

    quantum = max(2^floor(log2 v) / 8, 2^-17) (the spacing at v; 2^-17 in the subnormal range); then
    round_half_even(v / quantum) * quantum, both steps exact. NaN stays NaN.
    """
    value = value.clamp(max=UE5M3_MAX)
    power_of_two = (value.view(torch.int32) & 0x7F800000).view(torch.float32)  # +Inf for NaN
    quantum = (power_of_two * 0.125).clamp_(min=2.0 ** -17)
    return (value / quantum).round_().mul_(quantum)


def ue5m3_codes(values: torch.Tensor) -> torch.Tensor:
    """uint8 UE5M3 codes of fp32 values that are UE5M3 values (``round_ue5m3``'s outputs) or NaN."""
    bits = values.view(torch.int32)
    normal = (((bits >> 23) - 112) << 3) | ((bits >> 20) & 7)
    codes = torch.where(values >= UE5M3_MIN_NORMAL, normal, (values * 2.0 ** 17).nan_to_num(0.0).to(torch.int32))
    return torch.where(values.isnan(), UE5M3_NAN_CODE, codes).to(torch.uint8)


def ue5m3_values(codes: torch.Tensor) -> torch.Tensor:
    """fp32 values of uint8 UE5M3 codes (NaN for 0xFF)."""
    codes = codes.to(torch.int32)
    exponent, mantissa = codes >> 3, (codes & 7).float()
    normal = torch.ldexp(1.0 + mantissa * 0.125, exponent - 15)
    values = torch.where(exponent == 0, mantissa * 2.0 ** -17, normal)
    return torch.where(codes == UE5M3_NAN_CODE, torch.full_like(values, float("nan")), values)


# ----------------------------------------------------------------------------------------------
# Values path (no codes; bit-identical to decoding the codes above)


def e2m1_grid_step(magnitude: torch.Tensor) -> torch.Tensor:
    """Spacing of the E2M1 grid at |v| in [0, 6]: 0.5 below 2, 1 in [2, 4), 2 from 4 (fp32, new tensor).

    step = max(2^floor(log2 |v|), 1) / 2. 2^floor(log2 |v|) is |v| with its fp32 mantissa bits
    cleared (0 for zero and subnormal |v|, which the max lifts to 1; +Inf for NaN, so NaN stays NaN
    through |v| / step).
    """
    power_of_two = (magnitude.view(torch.int32) & 0x7F800000).view(torch.float32)
    return power_of_two.clamp_(min=1.0).mul_(0.5)


def round_e2m1_magnitude_(
    magnitude: torch.Tensor, rounding: str, uniform: Optional[torch.Tensor]
) -> torch.Tensor:
    """|q|: the E2M1 grid value of fp32 |v| (>= 0 or NaN), saturated at 6. Overwrites ``magnitude``.

    nearest:    round_half_even(|v| / step) * step                    (torch.round: half to even)
    stochastic: (floor(|v| / step) + (u < frac)) * step,  frac = |v| / step - floor(|v| / step)
    Same ties as ``round_e2m1``: 0.25 / 0.5 = 0.5 -> 0, 1.25 / 0.5 = 2.5 -> 2, 2.5 / 1 -> 2,
    5 / 2 = 2.5 -> 2 (so 4), ... |v| / step is exact; frac equals the codes path's
    (|v| - lo) * (1 / step) exactly; |v| = 6 gives frac = 0, so 6 never rounds up.
    """
    magnitude.clamp_(max=E2M1_MAX)  # NaN stays NaN
    step = e2m1_grid_step(magnitude)
    units = magnitude.div_(step)  # |v| / step: exact, step is a power of two
    if rounding == "nearest":
        return units.round_().mul_(step)
    lower = units.floor()
    fraction = units.sub_(lower)  # exact: lower <= units < 2 * lower, or lower = 0
    rounds_up = uniform < fraction  # adds 1 where u < frac (not out=: torch.compile cannot trace that)
    return lower.add_(rounds_up).mul_(step)


def e2m1_scaled_values(
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
    values = round_e2m1_magnitude_(magnitude, rounding, uniform)
    return values.copysign_(blocked).mul_(block_scale)
