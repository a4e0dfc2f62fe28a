"""An FP8 GEMM operand in the layouts torch's scaled GEMM takes, and the plain-torch quantizer of one.

``Fp8Operand`` is what ``models.quant.fp8_torch`` (the native FP8 layer) multiplies;
``quantize_reference`` builds one from ``models.quant.formats.quantize`` on any device and is the
torch reference of the Triton kernel (``models.quant.kernels.fp8``). Layouts, for an operand
``A [m, r]`` with the reduction dim r last (PyTorch ``ScaledBlas.cpp``, cuBLAS "1D and 128x128 2D
block scaling for FP8"):
- codes float8_e4m3fn [m, r] row-major;
- 1x128 scales [m, r/128] with strides (1, m) ("outer-dim-major");
- 128x128 scales [L4, m/128] with strides (1, L4), L4 = round_up(r/128, 4) (zero padding);
- per tensor: a 0-dim decode scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.quant import formats

BLOCK = 128
KINDS = ("1x128", "128x128", "tensor")


def round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


@dataclass
class Fp8Operand:
    """One GEMM operand ``A [m, r]`` (reduction dim r last) in the layout the scaled GEMM takes.

    data: float8_e4m3fn [m, r], row-major. scale: decode scales (1 / scale), fp32, laid out by kind:
    "1x128" [m, r/128] strides (1, m); "128x128" [L4, m/128] strides (1, L4), L4 = round_up(r/128, 4),
    rows r/128.. zero; "tensor" 0-dim.
    """

    data: torch.Tensor
    scale: torch.Tensor
    kind: str

    def natural_scales(self) -> torch.Tensor:
        """Decode scales indexed like formats.QuantizedTensor.block_scales: [m/tr, r/128] (0-dim per tensor)."""
        if self.kind == "128x128":
            return self.scale[: self.data.shape[1] // BLOCK].t()
        return self.scale

    def dequantize(self) -> torch.Tensor:
        """code * decode in fp32, [m, r]."""
        values = self.data.float()
        rows, reduction = values.shape
        scales = self.natural_scales()
        if self.kind == "tensor":
            return values * scales
        if self.kind == "1x128":
            return (values.reshape(rows, reduction // BLOCK, BLOCK) * scales[:, :, None]).reshape(rows, reduction)
        blocked = values.reshape(rows // BLOCK, BLOCK, reduction // BLOCK, BLOCK)
        return (blocked * scales[:, None, :, None]).reshape(rows, reduction)


def gemm_layout_scales(natural: torch.Tensor, kind: str) -> torch.Tensor:
    """Decode scales [m/tr, r/128] (0-dim per tensor) -> the layout of ``Fp8Operand.scale``."""
    if kind == "tensor":
        return natural.reshape(())
    blocks_m, blocks_r = natural.shape
    natural = natural.to(torch.float32)
    if kind == "1x128":
        # A fresh [r/128, m] allocation (default strides even when a dim is 1), seen transposed.
        return natural.t().clone(memory_format=torch.contiguous_format).t()  # [m, r/128], strides (1, m)
    if kind == "128x128":
        padding = natural.new_zeros(blocks_m, round_up(blocks_r, 4) - blocks_r)
        return torch.cat([natural, padding], dim=1).t()  # [L4, m/128], strides (1, L4)
    raise ValueError(f"unknown operand kind {kind!r}; expected one of {KINDS}")


def quantize_reference(tensor: torch.Tensor, kind: str, *, power_of_two_scales: bool = True,
                       transpose: bool = False) -> Fp8Operand:
    """The plain-torch quantizer (any device): operand ``tensor.t() if transpose else tensor``.

    kind "1x128" / "128x128": fp8_block with that tile along the operand's last dim; "tensor":
    fp8_tensor (power_of_two_scales ignored, as in formats). ``formats.quantize`` itself (the one
    torch implementation of blockwise FP8), its codes made row-major and its decode scales laid out
    for the GEMM; the fused Triton kernel is tested bit-identical against this.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown operand kind {kind!r}; expected one of {KINDS}")
    matrix = (tensor.t() if transpose else tensor).contiguous()  # codes come out row-major, as the GEMM takes them
    if kind == "tensor":
        quantized = formats.quantize(matrix, "fp8_tensor")
        decode = quantized.tensor_scale
    else:
        tile = (1, BLOCK) if kind == "1x128" else (BLOCK, BLOCK)
        quantized = formats.quantize(matrix, "fp8_block", tile=tile, power_of_two_scales=power_of_two_scales)
        decode = quantized.block_scales
    return Fp8Operand(quantized.codes, gemm_layout_scales(decode, kind), kind)
