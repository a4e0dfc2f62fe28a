"""The one import site of Triton in models.quant, its switch, and what every kernel family shares.

Every module of ``models.quant.kernels`` imports Triton through here. Without Triton this module
imports fine and ``has_triton()`` is False (no jit helper is defined then). The switch:
``use_triton(False)`` (or env ``MODELS_QUANT_TRITON=0``) makes ``enabled()`` False and every caller
falls back to its torch reference; tests flip it to compare the two paths.

Exactness rules every kernel follows (why the code looks the way it does):
- every fp32 division is ``tl.math.div_rn`` (Triton's ``/`` may lower to an approximate divide);
- every launch passes ``enable_fp_fusion=False``, so no multiply-add is contracted into an FMA;
- NaN-sensitive min/max use ``tl.where`` (``tl.minimum`` drops NaN by default); reductions take
  ``abs_nan_to_inf`` first, so a max never loses a NaN;
- roundings are done on the bits or arithmetically rather than by the backend's casts, whose
  lowering differs between Triton versions and its interpreter.

E4M3 rounding (``e4m3_round``), shared by the NVFP4 block scales and the FP8 element codes: for
|v| in [2^e, 2^(e+1)), (|v| + C) - C with C = 2^(e + 20) rounds |v| to E4M3's 3 mantissa bits, half
to even (fp32's quantum at C is E4M3's at |v|); C = 2^14 in E4M3's subnormal range (quantum 2^-9).
|v| saturates at 448 first. The code bits are assembled from the rounded value, so a carry into the
next binade comes out right (Triton's interpreter mis-rounds exactly those carries in its fp8 cast).
Source of the E4M3 layout: OCP 8-bit floating point spec (OFP8), E4M3 (bias 7, no Inf, 0x7F NaN).
UE5M3 (``ue5m3_round``, NVFP4's block scales in the ``nvfp4_ue5m3`` variant) is the same rounding with
E4M3's sign bit given to the exponent: bias 15, 0xFF NaN, largest 114688, quantum 2^-17 below 2^-14
(``models.quant.formats.elements.round_ue5m3`` is its torch reference).

bf16 rounding (``round_to_bf16``): by integer arithmetic on the bits (add 0x7FFF plus the lowest
kept bit, mask), identical to ``tensor.to(torch.bfloat16)``, or by the backend's fp32 -> bf16
conversion (cvt.rn.bf16.f32 on CUDA: RNE by PTX's definition, subnormals kept), which Triton's
interpreter truncates instead.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch

try:  # the one import site of Triton in models.quant
    import triton
    import triton.language as tl

    _TRITON_IMPORT_ERROR: Optional[BaseException] = None
except (ImportError, RuntimeError, OSError) as error:  # pragma: no cover - depends on the machine
    triton = None
    tl = None
    _TRITON_IMPORT_ERROR = error

_ENABLED = os.environ.get("MODELS_QUANT_TRITON", "1") != "0"
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
"""Triton's interpreter (TRITON_INTERPRET=1) runs the kernels on CPU tensors: slow, for checking."""
INSTALL_HINT = "pip install triton (or the project's 'gpu' extra: pip install -e .[gpu])"


def has_triton() -> bool:
    """Whether Triton imported (the fast paths also need a CUDA tensor)."""
    return triton is not None


def use_triton(enabled: bool) -> None:
    """The one switch: False forces the torch references everywhere (tests flip it)."""
    global _ENABLED
    _ENABLED = bool(enabled)


def enabled() -> bool:
    """Whether the fast paths are switched on and available."""
    return _ENABLED and has_triton()


def require_triton(what: str) -> None:
    """RuntimeError with the install hint unless Triton imported."""
    if triton is None:
        raise RuntimeError(f"{what} needs Triton ({_TRITON_IMPORT_ERROR}); {INSTALL_HINT}")


def check_input(x: torch.Tensor, *, dtypes: Tuple[torch.dtype, ...], cols_multiple: int, rows_multiple: int,
                what: str, name: Optional[str]) -> None:
    """Raise (naming ``name`` and ``what``) unless x is a 2D CUDA tensor (any device under the
    interpreter) of ``dtypes`` whose dims divide by the multiples."""
    require_triton(f"models.quant.kernels ({what})")
    where = f"{name}: " if name else ""
    if not (x.is_cuda or INTERPRETING):
        raise ValueError(f"{where}{what} needs a CUDA tensor, got device {x.device}")
    if x.dtype not in dtypes:
        raise TypeError(f"{where}{what} takes {dtypes}, got {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"{where}{what} takes a 2D tensor, got shape {list(x.shape)}")
    rows, cols = x.shape
    if cols % cols_multiple != 0:
        raise ValueError(f"{where}{what}: last dim {cols} is not a multiple of {cols_multiple}")
    if rows % rows_multiple != 0:
        raise ValueError(f"{where}{what}: leading dim {rows} is not a multiple of {rows_multiple}")


def seed_tensor(x: torch.Tensor, seed, generator: Optional[torch.Generator]) -> torch.Tensor:
    """A 1-element int64 seed on x's device: given, or drawn from the generator / global RNG (no
    host sync: the draw stays on the device)."""
    if isinstance(seed, torch.Tensor):
        return seed.to(device=x.device, dtype=torch.int64).reshape(1)
    if seed is not None:
        return torch.tensor([int(seed)], dtype=torch.int64, device=x.device)
    if generator is not None:
        drawn = torch.randint(0, 2**62, (1,), generator=generator, device=generator.device, dtype=torch.int64)
        return drawn.to(x.device)
    return torch.randint(0, 2**62, (1,), device=x.device, dtype=torch.int64)


def bf16_rounding_mode(x: torch.Tensor, rounding: str) -> int:
    """The RHT kernels' ROUND_BF16 constexpr for input x: 0 for fp32 input (the transform stays
    fp32), 1 integer rounding, 2 the hardware conversion (``rounding`` "integer" / "hardware";
    the interpreter always rounds by integer ops, its conversion truncates)."""
    if x.dtype != torch.bfloat16:
        return 0
    return 2 if rounding == "hardware" and not INTERPRETING else 1


if triton is not None:

    @triton.jit
    def nan_fp32():
        return tl.full([], 0x7FC00000, tl.int32).to(tl.float32, bitcast=True)

    @triton.jit
    def inf_fp32():
        return tl.full([], 0x7F800000, tl.int32).to(tl.float32, bitcast=True)

    @triton.jit
    def abs_nan_to_inf(x):
        """|x| with NaN mapped to +Inf, so max-reductions cannot lose a NaN."""
        magnitude = tl.abs(x)
        return tl.where(magnitude == magnitude, magnitude, inf_fp32())

    @triton.jit
    def round_3_mantissa_bits(magnitude, LARGEST: tl.constexpr, BIAS: tl.constexpr, NAN_CODE: tl.constexpr):
        """RNE of fp32 magnitude >= 0 (or NaN) to an 8-bit float of 3 mantissa bits and exponent bias BIAS
        (E4M3: 7; UE5M3: 15), saturating at LARGEST: (rounded fp32, int32 code without sign, NAN_CODE
        for NaN). C = 2^(e + 20) for |v| in [2^e, 2^(e+1)), at least 2^(21 - BIAS), whose fp32 quantum is
        the subnormal one, 2^(-BIAS - 2); normal codes ((e + BIAS) << 3) | mantissa from 2^(1 - BIAS)
        up, subnormal codes v * 2^(BIAS + 2)."""
        magnitude = tl.where(magnitude > LARGEST, LARGEST, magnitude)
        biased_exponent = (magnitude.to(tl.int32, bitcast=True) >> 23) & 0xFF
        magic = (tl.maximum(biased_exponent + 20, 148 - BIAS) << 23).to(tl.float32, bitcast=True)
        rounded = (magnitude + magic) - magic
        rounded_bits = rounded.to(tl.int32, bitcast=True)
        rounded_exponent = (rounded_bits >> 23) & 0xFF
        normal_code = ((rounded_exponent - (127 - BIAS)) << 3) | ((rounded_bits >> 20) & 7)
        subnormal_units = tl.full([], (129 + BIAS) << 23, tl.int32).to(tl.float32, bitcast=True)  # 2^(BIAS + 2)
        subnormal_code = (rounded * subnormal_units).to(tl.int32)
        code = tl.where(rounded_exponent >= 128 - BIAS, normal_code, subnormal_code)
        code = tl.where(rounded == rounded, code, NAN_CODE)
        return rounded, code

    @triton.jit
    def e4m3_round(magnitude):
        """E4M3 RNE of fp32 magnitude >= 0 (or NaN), saturating at 448: (rounded fp32, int32 code, no sign)."""
        return round_3_mantissa_bits(magnitude, 448.0, 7, 0x7F)

    @triton.jit
    def ue5m3_round(magnitude):
        """UE5M3 RNE of fp32 magnitude >= 0 (or NaN), saturating at 114688: (rounded fp32, int32 code)."""
        return round_3_mantissa_bits(magnitude, 114688.0, 15, 0xFF)

    @triton.jit
    def round_to_bf16(y, HARDWARE: tl.constexpr):
        """fp32 -> nearest bf16 (ties to even), returned as fp32; NaN stays NaN. By integer arithmetic
        on the bits, or (HARDWARE) by the backend's fp32 -> bf16 conversion (module docstring)."""
        if HARDWARE:
            return y.to(tl.bfloat16).to(tl.float32)
        bits = y.to(tl.int32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        return tl.where(y == y, rounded.to(tl.float32, bitcast=True), y)
