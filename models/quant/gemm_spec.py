"""Per-GEMM precision of a linear layer: which format, tile, rounding and RHT each operand of its
three GEMMs uses, and the builders of the recipes (what ``models.quant.recipe`` calls through
``format_registry.FORMAT_SPECS[fmt].linear_spec``, which imports this module; this one reads
the element formats' facts from ``models.quant.element_formats``).

Each GEMM is written A B^T with both operands blocked along its reduction dim (T tokens, K in_features,
N out_features): Fprop X [T, K] . W [N, K]^T; Dgrad dY [T, N] . W^T [K, N]^T; Wgrad dY^T [N, T] . X^T [K, T]^T
(the table with shapes: models.quant.linear).

The NVFP4 recipe of the paper (TE ``NVFP4BlockScaling``; ``nvfp4_linear_spec()``):
Fprop X 1x16 RNE, W 16x16 RNE; Dgrad dY 1x16 stochastic, W the very same quantized W as Fprop
(``LinearSpec.reuses_forward_weight``: a 16x16 tile is the same tile of W^T); Wgrad dY^T 1x16 along
tokens stochastic with RHT, X^T 1x16 along tokens RNE with RHT. Sources: "Pretraining Large
Language Models with NVFP4" (NVIDIA, 2025), TE ``NVFP4BlockScaling`` / ``Float8BlockScaling``.

Data and checks only: nothing here runs a GEMM (``models.quant.quantized_linear`` and its backends do).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch

from models.quant import formats
from models.quant.element_formats import E2M1_FORMATS, ELEMENT_FORMATS, GEMMS, ROUNDINGS, resolve_tile
from models.quant.rht import HADAMARD_SIZE


@dataclass(frozen=True)
class OperandSpec:
    """How one GEMM operand is quantized, along that GEMM's reduction dim."""

    fmt: str
    """An element format (element_formats.OPERAND_FORMATS): nvfp4, mxfp4, mxfp8, fp8_block, fp8_tensor."""
    tile: Optional[Tuple[int, int]] = None
    """Tile (rows, cols) with cols along the reduction dim; None for the format's default."""
    rounding: str = "nearest"
    """'nearest' (round half to even) or 'stochastic' (E2M1 formats only)."""
    rht: bool = False
    """Apply the 16x16 random Hadamard transform along the reduction dim before quantizing."""
    power_of_two_scales: bool = True
    """fp8_block only: round block scales down to powers of two (TE Float8BlockScaling default)."""
    four_over_six: Optional[str] = None
    """nvfp4 only: None (every block max maps to 6), or Four Over Six with this candidate error, 'mse' or
    'mae': each block keeps the lower-error of mapping its max to 4 or to 6 (formats.four_over_six)."""

    def __post_init__(self):
        object.__setattr__(self, "tile", resolve_tile(self.fmt, self.tile))
        if self.four_over_six is not None:
            if self.fmt not in formats.FOUR_OVER_SIX_FORMATS:
                raise ValueError(f"four_over_six applies to {formats.FOUR_OVER_SIX_FORMATS}, not {self.fmt!r}")
            if self.four_over_six not in formats.FOUR_OVER_SIX_ERRORS:
                raise ValueError(f"four_over_six must be None or one of {formats.FOUR_OVER_SIX_ERRORS}, "
                                 f"got {self.four_over_six!r}")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}, got {self.rounding!r}")
        if self.rounding == "stochastic" and self.fmt not in E2M1_FORMATS:
            raise ValueError(f"stochastic rounding is implemented for {E2M1_FORMATS}, not {self.fmt!r}")
        if self.rht and (self.tile is None or self.tile[0] != 1 or self.tile[1] % HADAMARD_SIZE != 0):
            raise ValueError(
                f"the RHT needs 1-row tiles whose length divides into {HADAMARD_SIZE}s, got {self.fmt} {self.tile}"
            )

    def scaled_values_exact_in(self, dtype: torch.dtype) -> bool:
        """Whether every scaled value q * s_b of this operand is exact in ``dtype``."""
        if dtype == torch.float32:
            return True
        element = ELEMENT_FORMATS[self.fmt]
        if element.exact_only_with_power_of_two_scales and not self.power_of_two_scales:
            return False
        return dtype in element.scaled_values_exact_in

    @property
    def transpose_invariant(self) -> bool:
        """Whether quantizing the transposed tensor gives the transposed result (square or no tiles, RNE).

        Four Over Six on a 16x16 tile is counted as such: its choice sums the tile's errors row by row, so
        the transposed tile could choose the other candidate in a near-tie; the transposed operand is
        therefore always the tensor quantized and then transposed (models.quant.linear, the kernels), as
        TE quantizes W once for Fprop and Dgrad."""
        square = self.tile is None or self.tile[0] == self.tile[1]
        return square and self.rounding == "nearest" and not self.rht

    def describe(self) -> str:
        tile = "tensor" if self.tile is None else f"{self.tile[0]}x{self.tile[1]}"
        extras = ["SR" if self.rounding == "stochastic" else "RNE"]
        if self.rht:
            extras.append("RHT")
        if self.fmt == "fp8_block":
            extras.append("pow2" if self.power_of_two_scales else "fp32 scales")
        if self.four_over_six is not None:
            extras.append(f"4/6-{self.four_over_six.upper()}")
        return f"{self.fmt} {tile} {'+'.join(extras)}"


@dataclass(frozen=True)
class GemmSpec:
    """The two quantized operands of one GEMM ``A B^T`` (both blocked along the reduction dim).

    Fprop: a = X, b = W. Dgrad: a = dY, b = W^T. Wgrad: a = dY^T, b = X^T.
    """

    a: OperandSpec
    """Left operand (X in Fprop, dY in Dgrad, dY^T in Wgrad)."""
    b: OperandSpec
    """Right operand (W in Fprop, W^T in Dgrad, X^T in Wgrad)."""

    def describe(self) -> str:
        return f"{self.a.describe()} x {self.b.describe()}"


@dataclass
class LinearSpec:
    """Per-GEMM precision of one linear layer; a None GEMM runs in high precision (compute dtype).

    Mutable on purpose: the late switch to BF16 sets GEMMs to None (``switched_to_high_precision``
    returns such a copy, for specs shared between layers).
    """

    fprop: Optional[GemmSpec] = None
    """Y = X W^T."""
    dgrad: Optional[GemmSpec] = None
    """dX = dY W."""
    wgrad: Optional[GemmSpec] = None
    """dW = dY^T X."""
    backend: str = "emulated"
    """Who runs the quantized GEMMs; only 'emulated' lives here (te/torch backends: the recipe)."""

    @property
    def quantized(self) -> bool:
        """Whether any GEMM is quantized."""
        return any(getattr(self, gemm) is not None for gemm in GEMMS)

    @property
    def stochastic(self) -> bool:
        """Whether any quantized operand rounds stochastically (the layer then draws random numbers)."""
        return any(
            operand.rounding == "stochastic"
            for gemm in GEMMS
            if getattr(self, gemm) is not None
            for operand in (getattr(self, gemm).a, getattr(self, gemm).b)
        )

    @property
    def reuses_forward_weight(self) -> bool:
        """Dgrad uses the W quantized in Fprop (same spec, transpose-invariant tiles: 2D or per tensor)."""
        return (
            self.fprop is not None
            and self.dgrad is not None
            and self.dgrad.b == self.fprop.b
            and self.fprop.b.transpose_invariant
        )

    def switched_to_high_precision(self, mode: str = "forward") -> "LinearSpec":
        """A copy with Fprop ('forward') or all GEMMs ('forward_backward') in high precision."""
        if mode == "forward":
            return dataclasses.replace(self, fprop=None)
        if mode == "forward_backward":
            return dataclasses.replace(self, fprop=None, dgrad=None, wgrad=None)
        raise ValueError(f"mode must be 'forward' or 'forward_backward', got {mode!r}")

    def describe(self) -> str:
        parts = []
        for gemm in GEMMS:
            gemm_spec = getattr(self, gemm)
            parts.append(f"{gemm}: {gemm_spec.describe() if gemm_spec else 'high precision'}")
        return "; ".join(parts)


# ----------------------------------------------------------------------------------------------
# Spec builders (called by models.quant.recipe)


def _gemm_or_none(enabled: bool, a: OperandSpec, b: OperandSpec) -> Optional[GemmSpec]:
    return GemmSpec(a, b) if enabled else None


FOUR_OVER_SIX_ROLES = ("x", "w", "dy")
"""The operand roles Four Over Six can apply to: X (Fprop X, Wgrad X^T), W (Fprop W, Dgrad W^T), dY (Dgrad
dY, Wgrad dY^T)."""


def nvfp4_linear_spec(
    weight_2d: bool = True,
    wgrad_rht: bool = True,
    stochastic_rounding: bool = True,
    quantize_fprop: bool = True,
    quantize_dgrad: bool = True,
    quantize_wgrad: bool = True,
    four_over_six: Sequence[str] = (),
    four_over_six_error: str = "mse",
    fmt: str = "nvfp4",
) -> LinearSpec:
    """The paper's NVFP4 recipe (module docstring); each technique switchable for ablations.

    ``four_over_six``: the roles (FOUR_OVER_SIX_ROLES) whose operands choose each block's scale by Four
    Over Six with ``four_over_six_error``. ``fmt``: the element format (nvfp4, or nvfp4_ue5m3 for UE5M3
    block scales).
    """
    unknown = sorted(set(four_over_six) - set(FOUR_OVER_SIX_ROLES))
    if unknown:
        raise ValueError(f"four_over_six names operand roles of {FOUR_OVER_SIX_ROLES}, got {unknown}")
    choice = {role: four_over_six_error if role in four_over_six else None for role in FOUR_OVER_SIX_ROLES}
    gradient_rounding = "stochastic" if stochastic_rounding else "nearest"
    weight = OperandSpec(fmt, (16, 16) if weight_2d else (1, 16), four_over_six=choice["w"])
    return LinearSpec(
        fprop=_gemm_or_none(quantize_fprop, OperandSpec(fmt, (1, 16), four_over_six=choice["x"]), weight),
        dgrad=_gemm_or_none(quantize_dgrad, OperandSpec(fmt, (1, 16), gradient_rounding,
                                                        four_over_six=choice["dy"]), weight),
        wgrad=_gemm_or_none(
            quantize_wgrad,
            OperandSpec(fmt, (1, 16), gradient_rounding, rht=wgrad_rht, four_over_six=choice["dy"]),
            OperandSpec(fmt, (1, 16), "nearest", rht=wgrad_rht, four_over_six=choice["x"]),
        ),
    )


def mxfp4_linear_spec(
    wgrad_rht: bool = True,
    stochastic_rounding: bool = True,
    quantize_fprop: bool = True,
    quantize_dgrad: bool = True,
    quantize_wgrad: bool = True,
) -> LinearSpec:
    """MXFP4 (1x32 E2M1, E8M0 scales) with the NVFP4 recipe's techniques, so a comparison isolates the format.

    There is no 2D option (OCP MX blocks are 1x32), so Dgrad re-quantizes W^T along N.
    """
    gradient_rounding = "stochastic" if stochastic_rounding else "nearest"
    block = OperandSpec("mxfp4")
    return LinearSpec(
        fprop=_gemm_or_none(quantize_fprop, block, block),
        dgrad=_gemm_or_none(quantize_dgrad, OperandSpec("mxfp4", rounding=gradient_rounding), block),
        wgrad=_gemm_or_none(
            quantize_wgrad,
            OperandSpec("mxfp4", rounding=gradient_rounding, rht=wgrad_rht),
            OperandSpec("mxfp4", rht=wgrad_rht),
        ),
    )


def mxfp8_linear_spec(
    quantize_fprop: bool = True, quantize_dgrad: bool = True, quantize_wgrad: bool = True, wgrad_rht: bool = False
) -> LinearSpec:
    """MXFP8: every operand 1x32 E4M3 with E8M0 scales, RNE, along each GEMM's reduction dim.

    ``wgrad_rht``: both Wgrad operands take the 16x16 RHT along tokens first (recipe mxfp8_wgrad_rht).
    """
    block = OperandSpec("mxfp8")
    wgrad_block = OperandSpec("mxfp8", rht=wgrad_rht)
    return LinearSpec(
        fprop=_gemm_or_none(quantize_fprop, block, block),
        dgrad=_gemm_or_none(quantize_dgrad, block, block),
        wgrad=_gemm_or_none(quantize_wgrad, wgrad_block, wgrad_block),
    )


def fp8_block_linear_spec(
    power_of_two_scales: bool = True,
    quantize_fprop: bool = True,
    quantize_dgrad: bool = True,
    quantize_wgrad: bool = True,
) -> LinearSpec:
    """The paper's FP8 baseline (TE Float8BlockScaling): W 128x128, activations and gradients 1x128."""
    vector = OperandSpec("fp8_block", (1, 128), power_of_two_scales=power_of_two_scales)
    weight = OperandSpec("fp8_block", (128, 128), power_of_two_scales=power_of_two_scales)
    return LinearSpec(
        fprop=_gemm_or_none(quantize_fprop, vector, weight),
        dgrad=_gemm_or_none(quantize_dgrad, vector, weight),
        wgrad=_gemm_or_none(quantize_wgrad, vector, vector),
    )


def fp8_tensor_linear_spec(
    quantize_fprop: bool = True, quantize_dgrad: bool = True, quantize_wgrad: bool = True
) -> LinearSpec:
    """Per-tensor current-scaled E4M3 for every operand (TE Float8CurrentScaling, E4M3 throughout)."""
    tensor = OperandSpec("fp8_tensor")
    return LinearSpec(
        fprop=_gemm_or_none(quantize_fprop, tensor, tensor),
        dgrad=_gemm_or_none(quantize_dgrad, tensor, tensor),
        wgrad=_gemm_or_none(quantize_wgrad, tensor, tensor),
    )



# ----------------------------------------------------------------------------------------------
# Shape checks


def _gemm_operands(tokens: int, in_features: int, out_features: int):
    """Per GEMM: (label, 2D shape, dim names) of its operands A and B, as they are quantized."""
    return {
        "fprop": (("X", (tokens, in_features), ("tokens", "in_features")),
                  ("W", (out_features, in_features), ("out_features", "in_features"))),
        "dgrad": (("dY", (tokens, out_features), ("tokens", "out_features")),
                  ("W^T", (in_features, out_features), ("in_features", "out_features"))),
        "wgrad": (("dY^T", (out_features, tokens), ("out_features", "tokens")),
                  ("X^T", (in_features, tokens), ("in_features", "tokens"))),
    }


def check_linear_shapes(spec: LinearSpec, tokens: int, in_features: int, out_features: int, name: str) -> None:
    """Raise ValueError naming the layer, GEMM, operand and dim if an operand does not divide its blocks.

    The message (and so ``name``) is built only when a check fails: under torch.compile nothing on the
    passing path reads the layer's name, so layers that differ only in name share one compiled graph.
    """
    operands = _gemm_operands(tokens, in_features, out_features)
    for gemm in GEMMS:
        gemm_spec = getattr(spec, gemm)
        if gemm_spec is None:
            continue
        for operand_spec, (label, shape, dim_names) in zip((gemm_spec.a, gemm_spec.b), operands[gemm]):
            if not formats.blockable(shape, operand_spec.fmt, operand_spec.tile):
                formats.check_blockable(
                    shape, operand_spec.fmt, operand_spec.tile,
                    name=f"layer {name!r} ({gemm.capitalize()} {label}, {operand_spec.describe()})",
                    dim_names=dim_names,
                )
