"""Four Over Six (arXiv 2512.02010): NVFP4 whose blocks choose between scaling their max to 6 or to 4.

E2M1's grid is coarsest at the top (4 -> 6): a block whose max maps to 6 rounds values between 4 and
6 of it with up to 1/6 relative error. Scaling the block max to 4 instead (a 1.5x larger scale) puts
those values on the finer 3 -> 4 steps. Each block (1x16, or 16x16 tile) is quantized both ways and
keeps the candidate with the lower error against its input. TE's "4over6" NVFP4 recipe
(transformer_engine/common/cast/nvfp4/quantize_4over6_nvfp4.cuh: ``compute_scale_pair``,
``accumulate_dequant_error``, ``reduce_group_sum_16``; the pure-torch
``NVFP4QuantizerRef._quantize_blockwise_4over6_reference``) fixes the fp32 arithmetic followed here:

    S_enc  = min(256 * 6 / amax, FLT_MAX); 1 if amax == 0 or S_enc == 0   (E4M3 bound 256, not 448)
    base   = (block_amax / 6) * S_enc                     a true division, then a product
    s4     = e4m3(min(base * 1.5, 448));   s6 = e4m3(min(base, 448))       RNE
    r_k    = min(1 / (fp32(s_k) * (1 / S_enc)), FLT_MAX)
    q_k    = e2m1(x * r_k)                                RNE, saturating at 6
    err_k  = sum over the block of d^2 (mse) or |d| (mae),  d = ((q_k * s_k) * amax) / 1536 - x
    choose s4 iff err4 < err6 (a tie keeps 6)

The bound 256 keeps the map-to-4 scale exact: s4 <= 256 * 1.5 = 384 < 448, so it never saturates.
The errors are fp32 sums in TE's order: along each row of a block, element 0 to 15; a 16x16 tile then
adds its 16 row sums as a tree (rows i and i + 8, then i and i + 4, ...: the warp reduction's order).

How it composes with the rest of the recipe (TE's kernel supports none of RHT and stochastic rounding
with 4over6; these are this project's definitions):
- RHT: the transform comes first; amax, scales and errors are those of the transformed operand, the
  values the GEMM multiplies. The RHT is orthogonal, so the MSE there is the MSE of the
  reconstruction.
- stochastic rounding: the candidate is chosen by the errors above (round to nearest), then the
  block is rounded stochastically with the chosen scale. The choice is a function of x alone, never
  of the random draws, so E[q * s_b] = x holds as for plain NVFP4 (choosing between stochastically
  rounded candidates would pick the luckier draw and bias the result).
- 2D: one choice per 16x16 tile, its error summed over the tile as above.
"""

from __future__ import annotations

from functools import partial
from typing import Tuple

import torch

from models.quant.element_formats import E2M1_MAX
import models.quant.formats.elements as elements  # the sibling itself, not through the package's __init__
from models.quant.formats.blocking import block_max, blocked_view
from models.quant.formats.elements import fp32, round_e4m3
from models.quant.formats.nvfp4 import block_reciprocal, nvfp4_global_scales
from models.quant.formats.quantized_tensor import Encoded

FOUR_OVER_SIX_ERRORS = ("mse", "mae")
"""The candidate errors: the sum of squared (mse) or absolute (mae) differences."""
FOUR_OVER_SIX_BOUND = 256.0
"""The E4M3 block scale the tensor amax maps to (S_enc = 1536 / amax)."""
MAP_TO_4 = 1.5
"""s4 / s6 before rounding: the block max lands on 4 instead of 6."""


def _row_sums_in_order(error: torch.Tensor) -> torch.Tensor:
    """[R/tr, tr, C/tc, tc] -> [R/tr, tr, C/tc, 1]: element 0 + element 1 + ... + element 15, in that order."""
    total = error[..., 0:1]
    for index in range(1, error.shape[3]):
        total = total + error[..., index:index + 1]
    return total


def _tile_sum_as_a_tree(row_sums: torch.Tensor) -> torch.Tensor:
    """[R/16, 16, C/tc, 1] -> [R/16, 1, C/tc, 1]: rows i + (i + 8), then i + (i + 4), i + (i + 2), i + (i + 1)."""
    total = row_sums
    while total.shape[1] > 1:
        half = total.shape[1] // 2
        total = total[:, :half] + total[:, half:]
    return total


def candidate_error(blocked: torch.Tensor, scale: torch.Tensor, reciprocal: torch.Tensor, amax: torch.Tensor,
                    error: str) -> torch.Tensor:
    """The error of quantizing each block with (s_b, r_b) = (scale, reciprocal), [R/tr, 1, C/tc, 1] fp32."""
    grid = elements.round_e2m1_magnitude_(blocked.abs().mul_(reciprocal), "nearest", None).copysign_(blocked)
    dequantized = grid.mul_(scale).mul_(amax).div_(fp32(FOUR_OVER_SIX_BOUND * E2M1_MAX, blocked.device))
    difference = dequantized.sub_(blocked)
    per_element = difference.mul_(difference) if error == "mse" else difference.abs_()
    sums = _row_sums_in_order(per_element)
    return _tile_sum_as_a_tree(sums) if sums.shape[1] > 1 else sums


def four_over_six_scales(
    blocked: torch.Tensor, error: str,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """From x blocked (fp32): the chosen s_b (float8_e4m3fn) and r_b (fp32), both [R/tr, 1, C/tc, 1]; S_dec,
    amax (0-dim). A NaN or Inf anywhere makes S_dec NaN: every scale is NaN (both errors NaN: 6 kept)."""
    device = blocked.device
    block_amax = block_max(blocked.abs())
    amax = block_amax.amax()
    encode, decode = nvfp4_global_scales(amax, FOUR_OVER_SIX_BOUND)
    base = (block_amax / fp32(E2M1_MAX, device)) * encode
    scale_4 = round_e4m3(base * fp32(MAP_TO_4, device)).float()
    scale_6 = round_e4m3(base).float()
    reciprocal_4, reciprocal_6 = block_reciprocal(scale_4, decode), block_reciprocal(scale_6, decode)
    error_4 = candidate_error(blocked, scale_4, reciprocal_4, amax, error)
    error_6 = candidate_error(blocked, scale_6, reciprocal_6, amax, error)
    map_to_4 = error_4 < error_6
    scale = torch.where(map_to_4, scale_4, scale_6).to(torch.float8_e4m3fn)
    return scale, torch.where(map_to_4, reciprocal_4, reciprocal_6), decode, amax


def _check_error(error: str) -> None:
    if error not in FOUR_OVER_SIX_ERRORS:
        raise ValueError(f"four_over_six must be one of {FOUR_OVER_SIX_ERRORS} (the candidate error), got {error!r}")


def codes(x2d, tile, rounding, uniform, power_of_two_scales, input_max, *, error: str) -> Encoded:
    blocked = blocked_view(x2d.float(), tile)
    block_scale, reciprocal, decode, amax = four_over_six_scales(blocked, error)
    scaled = blocked * reciprocal
    codes = elements.round_e2m1(scaled, rounding, None if uniform is None else blocked_view(uniform, tile))
    return Encoded(codes, block_scale[:, 0, :, 0], decode, amax)


def values(x2d, tile, rounding, uniform, power_of_two_scales, input_max, *, error: str):
    """(q * s_b fp32 blocked, S_dec) without codes."""
    blocked = blocked_view(x2d.float(), tile)
    block_scale, reciprocal, decode, _ = four_over_six_scales(blocked, error)
    magnitude = blocked.abs().mul_(reciprocal)
    uniform = None if uniform is None else blocked_view(uniform, tile)
    return elements.e2m1_scaled_values(blocked, magnitude, block_scale.float(), rounding, uniform), decode


def quantizer(error: str):
    """(codes, values) of Four Over Six with ``error``, the arguments of every format's two paths."""
    _check_error(error)
    return partial(codes, error=error), partial(values, error=error)
