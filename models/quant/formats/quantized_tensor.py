"""QuantizedTensor: the element codes and scales of a quantized tensor, and their decodings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Tuple

import torch

from models.quant.element_formats import E2M1_FORMATS, E2M1_MAX, E4M3_MAX
from models.quant.formats.blocking import blocked_view
from models.quant.formats.elements import E2M1_GRID, fp32


class Encoded(NamedTuple):
    """A format's codes path: what ``quantize`` stores in a QuantizedTensor (x2d's [rows, cols])."""

    codes: torch.Tensor
    block_scales: Optional[torch.Tensor]
    tensor_scale: Optional[torch.Tensor]
    amax: Optional[torch.Tensor] = None


@dataclass
class QuantizedTensor:
    """A quantized tensor: the real element codes and scales, enough to dequantize exactly.

    Shapes, with ``rows`` = product of the leading dims and ``cols`` = last dim, tile (tr, tc):
    - ``codes``: [rows, cols]. E2M1 formats: uint8, one code per element in the low 4 bits
      (bit 3 sign, bits 0-2 index ``E2M1_GRID``); ``packed_codes()`` gives two per byte.
      E4M3 formats: torch.float8_e4m3fn.
    - ``block_scales``: [rows / tr, cols / tc] decode scales: float8_e4m3fn (nvfp4),
      float8_e8m0fnu (mxfp4, mxfp8), float32 ``1/scale`` (fp8_block); None for fp8_tensor.
    - ``tensor_scale``: 0-dim fp32 per-tensor decode scale (nvfp4: 1/S_enc; fp8_tensor: 1/scale);
      None for the formats without one.
    Who needs only the values (an emulated GEMM) calls ``quantize_scaled_values`` or
    ``fake_quantize``: the same bits as ``scaled_values()`` / ``dequantize()``, without codes.
    """

    fmt: str
    codes: torch.Tensor
    block_scales: Optional[torch.Tensor]
    tensor_scale: Optional[torch.Tensor]
    tile: Optional[Tuple[int, int]]
    shape: torch.Size
    """Shape of the tensor that was quantized (dequantize() returns this shape)."""
    dtype: torch.dtype
    """Dtype of the tensor that was quantized (dequantize()'s default)."""
    power_of_two_scales: bool = False
    """fp8_block only: whether the block scales were rounded down to powers of two."""
    amax: Optional[torch.Tensor] = None
    """nvfp4 only: the 0-dim fp32 tensor amax that S_enc came from. TE stores it with the tensor,
    and its standalone dequantize kernel reads it (``dequantize_te_standalone``); 1/S_enc alone
    does not determine it."""
    scale_bound: float = E4M3_MAX
    """nvfp4: the block scale the amax maps to, S_enc = scale_bound * 6 / amax (448; 256 with Four
    Over Six, which TE records with the tensor as its E4M3 max; 114688 for nvfp4_ue5m3)."""

    @property
    def rows(self) -> int:
        return self.codes.shape[0]

    @property
    def cols(self) -> int:
        return self.codes.shape[1]

    def element_values(self) -> torch.Tensor:
        """The grid values q as fp32, [rows, cols] (before any scale)."""
        if self.fmt in E2M1_FORMATS:
            grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=self.codes.device)
            magnitude = grid[(self.codes & 7).long()]
            return torch.where((self.codes & 8) != 0, -magnitude, magnitude)
        return self.codes.float()

    def block_scales_fp32(self) -> torch.Tensor:
        """Per-block decode scales as fp32, broadcastable to the 4D blocked view [R/tr, 1, C/tc, 1]."""
        if self.block_scales is None:
            return torch.ones((1, 1, 1, 1), dtype=torch.float32, device=self.codes.device)
        scales = self.block_scales.float()
        return scales[:, None, :, None]

    def _blocked(self, values: torch.Tensor) -> torch.Tensor:
        return blocked_view(values, self.tile)

    def scaled_values(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """q * s_b without the per-tensor decode scale, in the original shape.

        What a block-scaled GEMM multiplies before it applies the per-tensor scales to its fp32
        output. Exact in bf16 for nvfp4, mxfp4/mxfp8 (outside the extreme exponents) and fp8_tensor,
        and for fp8_block with power-of-two scales: see ``scaled_values_exact_in``.
        """
        values = self._blocked(self.element_values()) * self.block_scales_fp32()
        return values.reshape(self.shape).to(dtype)

    def scaled_values_exact_in(self, dtype: torch.dtype) -> bool:
        """Whether ``scaled_values(dtype)`` is exact (q * s_b needs few significant bits)."""
        if dtype == torch.float32:
            return True
        if self.fmt == "fp8_block":
            return self.power_of_two_scales
        return True

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """x_hat = (q * s_b) * tensor_scale in fp32, then cast to ``dtype`` (default: the input's)."""
        values = self._blocked(self.element_values()) * self.block_scales_fp32()
        if self.tensor_scale is not None:
            values = values * self.tensor_scale
        return values.reshape(self.shape).to(dtype or self.dtype)

    def dequantize_te_standalone(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """nvfp4: x = q * ((fp32(s_b) * amax) * fp32(1 / 2688)) in fp32, then cast to ``dtype``.

        The arithmetic of TE's standalone NVFP4 dequantize kernel (transformer_engine/common/cast/
        nvfp4/dequantize_nvfp4.cuh, ``dequantize_fp4_kernel``: ``final_scale = scale * amax *
        factor_inv`` with ``factor_inv = 1.0 / (6.0 * 448.0)`` as an fp32 constant, evaluated left to
        right, then ``q * final_scale`` and a cast to the output type). It is *not* what a GEMM sees:
        training multiplies q * s_b and applies the per-tensor scales to the GEMM's fp32 output (see
        ``dequantize`` and models/quant/linear.py). Use it to compare with tensors that TE itself
        dequantized. A non-finite amax gives NaN everywhere, as ``dequantize`` does (s_b is NaN).
        """
        if self.fmt != "nvfp4":
            raise ValueError(f"dequantize_te_standalone() is TE's NVFP4 dequantize, not for {self.fmt}")
        if self.amax is None:
            raise ValueError("this nvfp4 QuantizedTensor carries no amax (build it with quantize())")
        # The constant is rounded once to fp32, as the CUDA constexpr float is (TE's E4M3 max: 448, or
        # 256 for a Four Over Six tensor).
        factor = fp32(1.0 / (E2M1_MAX * self.scale_bound), self.codes.device)
        block_factor = (self.block_scales_fp32() * self.amax) * factor  # two fp32 roundings, TE's order
        values = self._blocked(self.element_values()) * block_factor
        return values.reshape(self.shape).to(dtype or self.dtype)

    def packed_codes(self) -> torch.Tensor:
        """E2M1 codes two per byte, [rows, cols / 2] uint8: even column in the low nibble (TE's layout)."""
        if self.fmt not in E2M1_FORMATS:
            raise ValueError(f"packed_codes() is for E2M1 formats, not {self.fmt}")
        return self.codes[:, 0::2] | (self.codes[:, 1::2] << 4)
