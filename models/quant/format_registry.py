"""The registry of low-precision formats: every fact about a format, in one ``FormatSpec`` entry.

Who reads what:
- ``models.quant.recipe``: the recipe formats and backends a ``PrecisionConfig`` may name, the block
  edge a linear's dims must divide, the per-layer ``LinearSpec`` (``FormatSpec.linear_spec``), and
  where the torch backends run (``FormatSpec.native``: FP8 on Hopper, NVFP4 on Blackwell);
- the run planner (trainer/planning/layout.py): whether a format stays native under tensor parallelism
  (``runs_natively("torch", ...)``);
- ``models.quant.linear``: which Triton kernel quantizes an operand (``quantize_kernel``);
- ``models.quant.te_backend``: the TE recipe class, its options and the compute capability it needs;
- ``models.quant.diagnostics``: the element max (saturation);
- the GEMM cost model (trainer/planning/gemm_costs.py: FORMAT_COSTS is built from this registry): bytes per
  element and per scale, block sizes, whether Dgrad reuses Fprop's W, whether a per-tensor amax
  costs a second read, the peak-rate key.

Each entry stands on an element format (``models.quant.element_formats``: element kind, tiles),
which ``models.quant.formats`` quantizes and ``OperandSpec`` checks. Imports run one way:
format_registry -> gemm_spec (the LinearSpec builders) -> formats -> element_formats. A recipe
variant (``mxfp8_wgrad_rht``) reuses its base's element format and differs in how the LinearSpec
is built. Adding a format is one entry here plus, for a new element format, its ``ElementFormat``
and quantize functions (docs/adding_a_format.md).

Sources of the numbers: TE ``core_nvfp4.cuh`` (NVFP4), OCP MX v1.0 (MXFP4/MXFP8), TE
``Float8BlockScaling`` / ``Float8CurrentScaling`` (FP8), TE 2.20.2 measured on the H200 and
PyTorch's ``ScaledBlas.cpp`` (compute capabilities).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Dict, Mapping, Optional, Tuple

from models.quant import gemm_spec
from models.quant.element_formats import (  # noqa: F401 - re-exported: the registry's long-standing names
    E2M1_FORMATS,
    E2M1_MAX,
    E4M3_MAX,
    ELEMENT_FORMATS,
    GEMMS,
    OPERAND_FORMATS,
    ROUNDINGS,
    ElementFormat,
    Tile,
    resolve_tile,
)

BACKENDS = ("auto", "te", "torch", "emulated")
"""Who runs the quantized GEMMs (PrecisionConfig.backend)."""
HIGH_PRECISION = "bf16"
"""The recipe format (and the plan's per-GEMM label) of a GEMM that is not quantized."""


@dataclass(frozen=True)
class Capability:
    """Compute capabilities a backend runs a format on: ``minimum`` <= capability < ``below``."""

    minimum: Tuple[int, int]
    below: Optional[Tuple[int, int]] = None
    why: str = ""
    """What sets the range (for error messages), e.g. the library's own check."""

    def allows(self, capability: Optional[Tuple[int, int]]) -> bool:
        if capability is None:
            return False
        return capability >= self.minimum and (self.below is None or capability < self.below)

    def describe(self) -> str:
        """The range in words: 'compute capability 9.x', '8.9 or later', '10.0 up to 12.x'."""
        low = f"{self.minimum[0]}.{self.minimum[1]}"
        if self.below is None:
            text = f"compute capability {low} or later"
        elif self.minimum[1] == 0 and self.below == (self.minimum[0] + 1, 0):
            text = f"compute capability {self.minimum[0]}.x"
        else:
            text = f"compute capability {low} up to (not including) {self.below[0]}.{self.below[1]}"
        return f"{text} ({self.why})" if self.why else text


@dataclass(frozen=True, kw_only=True)
class OperandCosts:
    """What a format costs the GEMM cost model (trainer/planning/gemm_costs.py): storage and traffic per operand."""

    element_bytes: float = 1.0
    vector_block: int = 1
    """Elements per scale of activation and gradient operands (blocks along the reduction dim)."""
    vector_scale_bytes: float = 0.0
    weight_block: int = 1
    """Elements per scale of the weight operand (a 2D tile counts its area)."""
    weight_scale_bytes: float = 0.0
    weight_transpose_invariant: bool = True
    """Dgrad can reuse Fprop's quantized W (2D tiles or a per-tensor scale)."""
    amax_pass: bool = False
    """A per-tensor scale needs the tensor's amax first: the high-precision operand is read twice."""
    tensor_scale_bytes: float = 0.0
    peak_key: str = "fp8"
    """Key of trainer.hardware.GpuSpec.peak_flops: the dense tensor-core rate this format runs at."""


    def vector_bytes(self, elements: float) -> float:
        """Bytes of an activation/gradient operand of ``elements`` values in this format (scales included)."""
        scales = elements / self.vector_block * self.vector_scale_bytes if self.vector_scale_bytes else 0.0
        return elements * self.element_bytes + scales + self.tensor_scale_bytes

    def weight_bytes(self, elements: float) -> float:
        """Bytes of a weight operand of ``elements`` values in this format (scales included)."""
        scales = elements / self.weight_block * self.weight_scale_bytes if self.weight_scale_bytes else 0.0
        return elements * self.element_bytes + scales + self.tensor_scale_bytes

    @property
    def reads_per_quantization(self) -> int:
        return 2 if self.amax_pass else 1


@dataclass(frozen=True)
class FormatSpec(OperandCosts):
    """Everything the code needs to know about one format (or recipe variant)."""

    name: str
    label: str
    """One line for tables: elements, blocks, scales."""
    element_format: ElementFormat
    """What its operands are quantized to (a recipe variant shares its base's)."""
    block_edge: int
    """What a quantized linear's in_features and out_features must divide by (block or tile edge)."""
    linear_spec: Callable[..., gemm_spec.LinearSpec]
    """(PrecisionConfig, quantize_fprop=, quantize_dgrad=, quantize_wgrad=) -> the layer's LinearSpec."""
    quantize_kernel: Optional[str] = None
    """The module of ``models.quant.kernels`` that quantizes operands of this element format on CUDA
    in the emulated backend (bit-identical to ``formats``); None: the torch reference runs."""
    native: Mapping[str, Capability] = field(default_factory=dict)
    """Backend ('te', 'torch') -> compute capabilities it runs this format on natively."""
    te_recipe: Optional[str] = None
    """Transformer Engine recipe class (transformer_engine.common.recipe); None: no TE training recipe."""
    te_recipe_options: Callable[..., Dict[str, object]] = lambda cfg: {}
    """PrecisionConfig -> that recipe's keyword arguments (as plain data; te_backend builds the recipe)."""

    @property
    def quantizes_as(self) -> str:
        """The element format of the operands (``formats.quantize``'s ``fmt``)."""
        return self.element_format.name

    @property
    def element(self) -> str:
        """'e2m1' or 'e4m3'."""
        return self.element_format.element

    @property
    def default_tile(self) -> Tile:
        return self.element_format.default_tile

    @property
    def allowed_tiles(self) -> Tuple[Tile, ...]:
        return self.element_format.allowed_tiles

    @property
    def element_max(self) -> float:
        return self.element_format.element_max

    @property
    def stochastic_rounding(self) -> bool:
        """Whether stochastic rounding is implemented (E2M1 elements only)."""
        return self.element_format.stochastic_rounding

    def runs_natively(self, backend: str, capability: Optional[Tuple[int, int]]) -> bool:
        return backend in self.native and self.native[backend].allows(capability)


def _nvfp4_linear_spec(cfg, *, four_over_six, fmt: str = "nvfp4", **gemms) -> gemm_spec.LinearSpec:
    """The NVFP4 recipe's LinearSpec from the config's knobs (gemm_spec.nvfp4_linear_spec)."""
    return gemm_spec.nvfp4_linear_spec(
        weight_2d=cfg.weight_2d, wgrad_rht=cfg.wgrad_rht, stochastic_rounding=cfg.gradient_stochastic_rounding,
        four_over_six=tuple(four_over_six), four_over_six_error=cfg.four_over_six_error, fmt=fmt, **gemms)


def _te_nvfp4_options(cfg) -> Dict[str, object]:
    """NVFP4BlockScaling's options; ValueError for what this recipe asks and TE's does not run."""
    if cfg.four_over_six:
        raise ValueError("TE's NVFP4 recipe runs Four Over Six only without RHT and stochastic rounding; "
                         "precision.four_over_six runs on backend=emulated")
    return dict(disable_rht=not cfg.wgrad_rht, disable_stochastic_rounding=not cfg.gradient_stochastic_rounding,
                disable_2d_quantization=not cfg.weight_2d)


NVFP4_TORCH = Capability((10, 0), why="Blackwell: cuBLASLt's block-scaled FP4 GEMM")
"""Where torch's NVFP4 scaled GEMM runs (models.quant.nvfp4_torch). PyTorch gates its NVFP4 GEMM tests on
capability 10.0 and later (``PLATFORM_SUPPORTS_MX_GEMM`` = SM100OrLater, which takes in 12.x) and skips only
MXFP4 on 12.x; its scaled_mm has no NVFP4-specific capability check of its own (``ScaledBlas.cpp``)."""

FORMAT_SPECS: Dict[str, FormatSpec] = {
    spec.name: spec
    for spec in (
        FormatSpec(
            "nvfp4", "NVFP4 (E2M1, 1x16 / 16x16 E4M3 scales + fp32 tensor scale)", ELEMENT_FORMATS["nvfp4"],
            block_edge=16,
            linear_spec=lambda cfg, **gemms: _nvfp4_linear_spec(cfg, four_over_six=cfg.four_over_six, **gemms),
            quantize_kernel="nvfp4",
            native={"te": Capability((10, 0)), "torch": NVFP4_TORCH},
            te_recipe="NVFP4BlockScaling",
            te_recipe_options=lambda cfg: _te_nvfp4_options(cfg),
            element_bytes=0.5, vector_block=16, vector_scale_bytes=1, weight_block=16 * 16, weight_scale_bytes=1,
            amax_pass=True, tensor_scale_bytes=4, peak_key="nvfp4",
        ),
        FormatSpec(
            "mxfp4", "MXFP4 (E2M1, 1x32 E8M0 scales)", ELEMENT_FORMATS["mxfp4"], block_edge=32,
            linear_spec=lambda cfg, **gemms: gemm_spec.mxfp4_linear_spec(
                wgrad_rht=cfg.wgrad_rht, stochastic_rounding=cfg.gradient_stochastic_rounding, **gemms),
            quantize_kernel="mx",
            element_bytes=0.5, vector_block=32, vector_scale_bytes=1, weight_block=32, weight_scale_bytes=1,
            weight_transpose_invariant=False, peak_key="nvfp4",
        ),
        FormatSpec(
            "mxfp8", "MXFP8 (E4M3, 1x32 E8M0 scales)", ELEMENT_FORMATS["mxfp8"], block_edge=32,
            linear_spec=lambda cfg, **gemms: gemm_spec.mxfp8_linear_spec(**gemms),
            native={"te": Capability((10, 0))},
            te_recipe="MXFP8BlockScaling",
            element_bytes=1.0, vector_block=32, vector_scale_bytes=1, weight_block=32, weight_scale_bytes=1,
            weight_transpose_invariant=False, peak_key="mxfp8",
        ),
        FormatSpec(
            "fp8_block", "FP8 (E4M3, 1x128 / 128x128 fp32 scales)", ELEMENT_FORMATS["fp8_block"], block_edge=128,
            linear_spec=lambda cfg, **gemms: gemm_spec.fp8_block_linear_spec(
                power_of_two_scales=cfg.fp8_power_of_two_scales, **gemms),
            native={"te": Capability((9, 0)), "torch": Capability(
                (9, 0), below=(10, 0), why="PyTorch runs the DeepSeek-style blockwise FP8 GEMM on SM 9.x only")},
            te_recipe="Float8BlockScaling",
            te_recipe_options=lambda cfg: dict(power_2_scale=cfg.fp8_power_of_two_scales),
            element_bytes=1.0, vector_block=128, vector_scale_bytes=4, weight_block=128 * 128, weight_scale_bytes=4,
            peak_key="fp8",
        ),
        FormatSpec(
            "fp8_tensor", "FP8 (E4M3, per-tensor scale)", ELEMENT_FORMATS["fp8_tensor"],
            block_edge=16,  # 16: what torch._scaled_mm needs
            linear_spec=lambda cfg, **gemms: gemm_spec.fp8_tensor_linear_spec(**gemms),
            native={"te": Capability((8, 9)), "torch": Capability((8, 9), why="torch._scaled_mm per tensor")},
            te_recipe="Float8CurrentScaling",
            te_recipe_options=lambda cfg: dict(fp8_format="E4M3"),
            element_bytes=1.0, amax_pass=True, tensor_scale_bytes=4, peak_key="fp8",
        ),
    )
}
"""Format name -> its FormatSpec, in the order tables list them."""
FORMAT_SPECS["mxfp8_wgrad_rht"] = dataclasses.replace(
    FORMAT_SPECS["mxfp8"], name="mxfp8_wgrad_rht", label="MXFP8 (E4M3, 1x32 E8M0 scales), RHT on Wgrad",
    native={}, te_recipe=None,  # emulated only: TE's MXFP8 recipe has no RHT
    linear_spec=lambda cfg, **gemms: gemm_spec.mxfp8_linear_spec(wgrad_rht=True, **gemms),
)

# NVFP4 variants beyond the paper's recipe, each the full recipe with one change (docs/numerics.md). No TE
# recipe runs them: TE's 4over6 runs without RHT and stochastic rounding, and none has UE5M3 scales. Four Over
# Six's operands are plain E2M1 codes and E4M3 block scales (only S_enc differs), which torch's NVFP4 GEMM
# takes as they are; UE5M3 scales it cannot take (its 1x16 scales are float8_e4m3fn).
FORMAT_SPECS["nvfp4_4over6"] = dataclasses.replace(
    FORMAT_SPECS["nvfp4"], name="nvfp4_4over6",
    label="NVFP4, Four Over Six block scales (each block maps its max to 4 or 6, the lower error)",
    native={"torch": NVFP4_TORCH}, te_recipe=None,
    linear_spec=lambda cfg, **gemms: _nvfp4_linear_spec(
        cfg, four_over_six=cfg.four_over_six or gemm_spec.FOUR_OVER_SIX_ROLES, **gemms),
)
FORMAT_SPECS["nvfp4_ue5m3"] = dataclasses.replace(
    FORMAT_SPECS["nvfp4"], name="nvfp4_ue5m3", label="NVFP4 with UE5M3 block scales (E2M1, 1x16 / 16x16 + fp32 tensor scale)",
    element_format=ELEMENT_FORMATS["nvfp4_ue5m3"], native={}, te_recipe=None,
    linear_spec=lambda cfg, **gemms: _nvfp4_linear_spec(cfg, four_over_six=(), fmt="nvfp4_ue5m3", **gemms),
)

RECIPE_FORMATS = (HIGH_PRECISION, *FORMAT_SPECS)
"""What PrecisionConfig.format may name."""


def format_spec(name: str) -> FormatSpec:
    """The registry entry of ``name``; ValueError listing the known formats if there is none."""
    try:
        return FORMAT_SPECS[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r}; expected one of {tuple(FORMAT_SPECS)}") from None


def quantize_kernel(fmt: str) -> Optional[str]:
    """The ``models.quant.kernels`` module that quantizes operands of element format ``fmt`` (None: none)."""
    return FORMAT_SPECS[fmt].quantize_kernel
