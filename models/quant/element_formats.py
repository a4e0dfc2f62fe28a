"""The element formats an operand can be quantized to: element kind, element max and tiles.

The bottom of models.quant's format layers, importing nothing of them: ``models.quant.formats``
(the quantize arithmetic) and ``models.quant.gemm_spec`` (``OperandSpec``) read these facts, and
``models.quant.format_registry`` (``FormatSpec``, what a ``PrecisionConfig`` names) builds each
entry on one of them. A recipe variant (``mxfp8_wgrad_rht``) reuses an element format here; a new
element type or scale rule adds one ``ElementFormat`` and its quantize functions in
``models.quant.formats`` (docs/adding_a_format.md).

Sources: TE ``core_nvfp4.cuh`` (NVFP4), OCP Microscaling Formats v1.0 (MXFP4/MXFP8), TE
``Float8BlockScaling`` / ``Float8CurrentScaling`` (FP8).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

GEMMS = ("fprop", "dgrad", "wgrad")
"""The three GEMMs of a linear layer: Y = X W^T, dX = dY W, dW = dY^T X."""
ROUNDINGS = ("nearest", "stochastic")

E2M1_MAX = 6.0
E4M3_MAX = 448.0
UE5M3_MAX = 114688.0
"""The largest UE5M3 block scale: 2^16 * 1.75 (code 0xFE; 0xFF is NaN, models.quant.formats.elements)."""

Tile = Optional[Tuple[int, int]]
"""(rows, cols) with cols along the reduction dim; None: one scale for the whole tensor."""


@dataclass(frozen=True)
class ElementFormat:
    """How the values of one quantized operand are stored: element type and scaling tiles."""

    name: str
    element: str
    """'e2m1' or 'e4m3'."""
    default_tile: Tile
    allowed_tiles: Tuple[Tile, ...]
    scaled_values_exact_in: Tuple[torch.dtype, ...] = ()
    """The 16-bit dtypes that hold every scaled value q * s_b exactly, so that the emulated GEMM can
    multiply scaled values in them (fp32 holds every format's)."""
    exact_only_with_power_of_two_scales: bool = False
    """Exact in those dtypes only with power-of-two scales (fp8_block's ``power_of_two_scales``)."""

    @property
    def element_max(self) -> float:
        return E2M1_MAX if self.element == "e2m1" else E4M3_MAX

    @property
    def stochastic_rounding(self) -> bool:
        """Whether stochastic rounding is implemented (E2M1 elements only)."""
        return self.element == "e2m1"


ELEMENT_FORMATS: Dict[str, ElementFormat] = {
    spec.name: spec
    for spec in (
        # |q * s_b| in [2^-10, 2688] with <= 7 significant bits: exact in bf16 and fp16.
        ElementFormat("nvfp4", "e2m1", default_tile=(1, 16), allowed_tiles=((1, 16), (16, 16)),
                      scaled_values_exact_in=(torch.bfloat16, torch.float16)),
        # E8M0 scales span fp32's exponent range, which bf16 shares and fp16 does not.
        # nvfp4 with UE5M3 block scales (arXiv 2509.17791): q * s_b has <= 6 significant bits and
        # reaches 6 * 114688, past fp16's range.
        ElementFormat("nvfp4_ue5m3", "e2m1", default_tile=(1, 16), allowed_tiles=((1, 16), (16, 16)),
                      scaled_values_exact_in=(torch.bfloat16,)),
        ElementFormat("mxfp4", "e2m1", default_tile=(1, 32), allowed_tiles=((1, 32),),
                      scaled_values_exact_in=(torch.bfloat16,)),
        ElementFormat("mxfp8", "e4m3", default_tile=(1, 32), allowed_tiles=((1, 32),),
                      scaled_values_exact_in=(torch.bfloat16,)),
        ElementFormat("fp8_block", "e4m3", default_tile=(1, 128), allowed_tiles=((1, 128), (128, 128)),
                      scaled_values_exact_in=(torch.bfloat16,), exact_only_with_power_of_two_scales=True),
        # The values path gives q (the per-tensor scale applies to the GEMM's output): E4M3 codes.
        ElementFormat("fp8_tensor", "e4m3", default_tile=None, allowed_tiles=(None,),
                      scaled_values_exact_in=(torch.bfloat16, torch.float16)),
    )
}
"""Element format name -> its facts."""

OPERAND_FORMATS = tuple(ELEMENT_FORMATS)
"""Element formats ``formats.quantize`` implements (an OperandSpec's ``fmt``)."""
E2M1_FORMATS = tuple(name for name, spec in ELEMENT_FORMATS.items() if spec.element == "e2m1")


def resolve_tile(fmt: str, tile) -> Tile:
    """The tile an operand of element format ``fmt`` uses: the default when ``tile`` is None.

    ValueError if ``fmt`` is not an element format or the tile is not allowed for it.
    """
    if fmt not in ELEMENT_FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {OPERAND_FORMATS}")
    spec = ELEMENT_FORMATS[fmt]
    if tile is None:
        return spec.default_tile
    tile = tuple(int(t) for t in tile)
    if tile not in spec.allowed_tiles:
        raise ValueError(f"format {fmt!r} does not support tile {tile}; allowed: {spec.allowed_tiles}")
    return tile
