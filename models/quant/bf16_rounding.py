"""fp32 -> bf16 rounding that survives torch.compile.

    round_to_bf16_by_bits(y) == y.to(torch.bfloat16).to(torch.float32)     bit for bit (NaN stays NaN)

by integer operations on the fp32 bits: add 0x7FFF plus the lowest kept bit (bit 16), clear the low
16 bits. That is round-to-nearest, ties to even, with a carry into the exponent where the mantissa
overflows and to Inf past bf16's largest finite value, as torch's cast (the Triton kernels'
``kernels.triton_common.round_to_bf16`` does the same arithmetic).

Why not the cast itself: when Inductor fuses ``x.to(bf16)`` into a consumer that computes in fp32 it
may keep the fp32 value and drop the rounding (pytorch/pytorch#179561, fixed after torch 2.11; on
the CPU too, pytorch/pytorch#185337). A quantized GEMM's bf16 output and the RHT's bf16 output are rounded points
of the recipe, which a compiled model must keep to match eager and Transformer Engine; integer
operations cannot be elided.
"""

from __future__ import annotations

import torch


def round_to_bf16_by_bits(y: torch.Tensor) -> torch.Tensor:
    """The nearest bf16 value of each element of fp32 ``y`` (ties to even), as fp32; same shape."""
    bits = y.view(torch.int32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & -65536).view(torch.float32)
    return torch.where(torch.isnan(y), y, rounded)


def to_dtype_rounded(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``y.to(dtype)`` for fp32 ``y``, with a bf16 rounding that torch.compile keeps (see the module
    docstring); other dtypes are a plain cast."""
    if dtype == torch.bfloat16 and y.dtype == torch.float32:
        return round_to_bf16_by_bits(y).to(torch.bfloat16)  # exact: already a bf16 value
    return y.to(dtype)
