"""The one import site of Triton in models.quant, its switch, and the jit helpers both kernel modules use.

``models.quant.kernels`` (NVFP4) and ``models.quant.fp8_kernels`` (blockwise FP8) import Triton
through here. Without Triton this module imports fine and ``has_triton()`` is False (no jit helper
is defined then). The switch: ``use_triton(False)`` (or env ``MODELS_QUANT_TRITON=0``) makes
``enabled()`` False and every caller falls back to its torch reference.

E4M3 rounding (``e4m3_round``), shared by the NVFP4 block scales and the FP8 element codes, is done
arithmetically rather than by the backend's fp8 cast, so the result does not depend on how a Triton
version lowers that cast (its interpreter, for one, mis-rounds carries into the next binade): for
|v| in [2^e, 2^(e+1)), (|v| + C) - C with C = 2^(e + 20) rounds |v| to E4M3's 3 mantissa bits, half
to even (fp32's quantum at C is E4M3's at |v|); C = 2^14 in E4M3's subnormal range (quantum 2^-9).
|v| saturates at 448 first. The code bits are assembled from the rounded value, so a carry into the
next binade comes out right. Callers launch with ``enable_fp_fusion=False`` (no contraction of the
add-subtract). Source of the E4M3 layout: OCP 8-bit floating point spec (OFP8), E4M3 (bias 7, no Inf,
0x7F NaN).
"""

from __future__ import annotations

import os
from typing import Optional

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
"""Triton's interpreter (TRITON_INTERPRET=1) runs the kernels on CPU tensors: slow, for debugging."""
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
    def e4m3_round(magnitude):
        """E4M3 RNE of fp32 magnitude >= 0 (or NaN), saturating at 448: (rounded fp32, int32 code, no sign)."""
        magnitude = tl.where(magnitude > 448.0, 448.0, magnitude)
        biased_exponent = (magnitude.to(tl.int32, bitcast=True) >> 23) & 0xFF
        magic = (tl.maximum(biased_exponent + 20, 141) << 23).to(tl.float32, bitcast=True)
        rounded = (magnitude + magic) - magic
        rounded_bits = rounded.to(tl.int32, bitcast=True)
        normal_code = ((((rounded_bits >> 23) & 0xFF) - 120) << 3) | ((rounded_bits >> 20) & 7)
        subnormal_code = (rounded * 512.0).to(tl.int32)
        code = tl.where(rounded >= 0.015625, normal_code, subnormal_code)
        code = tl.where(rounded == rounded, code, 0x7F)
        return rounded, code
