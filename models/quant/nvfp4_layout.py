"""NVFP4 operands as torch's block-scaled FP4 GEMM reads them: packed E2M1 codes and swizzled E4M3 scales.

Layouts of an operand [rows, R] (PyTorch ``ScaledBlas.cpp`` ``_scaled_nvfp4_nvfp4``; cuBLAS, "1D Block Scaling
Factors Layout"; models.quant.nvfp4_torch has the GEMM and the layer):
- codes: uint8 [rows, R / 2], row-major, two codes a byte with element 2j in the low nibble (torch's
  ``pack_uint4``), zero-padded to R % 32 == 0 for the GEMM;
- block scales: E4M3 bytes [rows, R / 16], zero-padded to [round_up(rows, 128), round_up(R / 16, 4)] and laid
  out in cuBLAS's 128x4 tiles: scale (r, c) at element
  512 * (r // 128 * tiles_per_row + c // 4) + 16 * (r % 32) + 4 * (r % 128 // 32) + c % 4
  (``SwizzleType.SWIZZLE_32_4_4``; torch's ``to_blocked`` writes the same);
- the per-tensor decode scale S_dec: fp32, one element.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from models.quant import formats

BLOCK = 16
"""Elements per block scale (and the edge of a 2D weight tile)."""
REDUCTION_MULTIPLE = 32
"""A packed row of whole 16 bytes: what torch's scaled_mm takes along the reduction dim."""
SCALE_TILE_ROWS, SCALE_TILE_COLUMNS = 128, 4
"""cuBLAS's block-scale tile: 128 rows of 4 scales (512 bytes)."""


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """uint8 E2M1 codes [rows, cols] (any strides) -> [rows, cols / 2] uint8, row-major, element 2j in the
    low nibble and 2j + 1 in the high one: the bytes of torch.float4_e2m1fn_x2."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_codes: an even number of columns is needed, got {list(codes.shape)}")
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()


def unpack_codes(data: torch.Tensor) -> torch.Tensor:
    """The inverse of ``pack_codes``: [rows, bytes] uint8 -> [rows, 2 * bytes] codes."""
    return torch.stack((data & 15, data >> 4), dim=-1).reshape(data.shape[0], -1)


def _scale_tiles(rows: int, cols: int) -> Tuple[int, int]:
    return -(-rows // SCALE_TILE_ROWS), -(-cols // SCALE_TILE_COLUMNS)


def swizzle_scales(scales: torch.Tensor) -> torch.Tensor:
    """Block scales [rows, cols] (one byte each) -> one vector in cuBLAS's 128x4 tile layout, zero-padded.

    Row r = 128 t + 32 a + b and column c = 4 u + v land at 512 (t * tiles_per_row + u) + 16 b + 4 a + v:
    the view [t, a, b, u, v] read in the order [t, u, b, a, v]."""
    rows, cols = scales.shape
    row_tiles, col_tiles = _scale_tiles(rows, cols)
    padded = F.pad(scales, (0, col_tiles * SCALE_TILE_COLUMNS - cols, 0, row_tiles * SCALE_TILE_ROWS - rows))
    return padded.reshape(row_tiles, 4, 32, col_tiles, SCALE_TILE_COLUMNS).permute(0, 3, 2, 1, 4).reshape(-1)


def unswizzle_scales(swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The inverse of ``swizzle_scales``: the [rows, cols] scales back from the tile layout."""
    row_tiles, col_tiles = _scale_tiles(rows, cols)
    tiles = swizzled.reshape(row_tiles, col_tiles, 32, 4, SCALE_TILE_COLUMNS).permute(0, 3, 2, 1, 4)
    return tiles.reshape(row_tiles * SCALE_TILE_ROWS, col_tiles * SCALE_TILE_COLUMNS)[:rows, :cols]


@dataclass
class Nvfp4Operand:
    """One GEMM operand [rows, reduction] as torch's NVFP4 scaled matmul takes it (module docstring).

    data: packed codes, uint8 [rows, padded reduction / 2], row-major; scale: the E4M3 block scales'
    bytes in the swizzled layout (uint8, flat); decode: S_dec, fp32, 0-dim; reduction: before padding.
    """

    data: torch.Tensor
    scale: torch.Tensor
    decode: torch.Tensor
    reduction: int

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    def codes(self) -> torch.Tensor:
        """uint8 E2M1 codes [rows, reduction]."""
        return unpack_codes(self.data)[:, : self.reduction]

    def block_scales(self) -> torch.Tensor:
        """float8_e4m3fn [rows, reduction / 16] (the padding dropped)."""
        padded_blocks = 2 * self.data.shape[1] // BLOCK
        return unswizzle_scales(self.scale, self.rows, padded_blocks)[:, : self.reduction // BLOCK].view(
            torch.float8_e4m3fn)

    def scaled_values(self) -> torch.Tensor:
        """q * s_b in fp32 [rows, reduction] (exact): what the tensor cores multiply."""
        grid = torch.tensor(formats.E2M1_GRID, dtype=torch.float32, device=self.data.device)
        codes = self.codes()
        values = torch.where((codes & 8) != 0, -grid[(codes & 7).long()], grid[(codes & 7).long()])
        return values * self.block_scales().float().repeat_interleave(BLOCK, dim=1)

    def dequantize(self) -> torch.Tensor:
        """(q * s_b) * S_dec in fp32 [rows, reduction], QuantizedTensor.dequantize's order."""
        return self.scaled_values() * self.decode


@dataclass
class Nvfp4Codes:
    """A quantized operand [rows, reduction] as the quantizers give it.

    data: its E2M1 codes packed two a byte (``pack_codes``' layout), uint8 [rows, reduction / 2], or [rows,
        round_up(reduction, 32) / 2] with zero codes past the reduction (as the kernels write them);
    scales: E4M3 block-scale bytes [rows / tile_rows, reduction / 16], any strides (a transposed operand's are a
        view); decode: the decode scale (one fp32 element); tile_rows: 16 for 16x16 tiles, else 1;
    transposed_data: 16x16 tiles only, the transposed operand's packed codes where the kernel wrote them in the
        same pass (``t`` takes them; without them it repacks)."""

    data: torch.Tensor
    scales: torch.Tensor
    decode: torch.Tensor
    tile_rows: int = 1
    transposed_data: Optional[torch.Tensor] = None

    @classmethod
    def from_codes(cls, codes: torch.Tensor, scales: torch.Tensor, decode: torch.Tensor,
                   tile_rows: int = 1) -> "Nvfp4Codes":
        """From uint8 codes one an element [rows, reduction] (any strides), as the torch reference gives them."""
        return cls(pack_codes(codes), scales, decode, tile_rows)

    @property
    def reduction(self) -> int:
        return BLOCK * self.scales.shape[1]

    def codes(self) -> torch.Tensor:
        """uint8 E2M1 codes [rows, reduction]."""
        return unpack_codes(self.data)[:, : self.reduction]

    def row_slice(self, start: int, count: int) -> "Nvfp4Codes":
        """Rows [start, start + count) (views of codes and scales), whole tiles: a 16x16 tile spans 16 rows."""
        if start % self.tile_rows or count % self.tile_rows:
            raise ValueError(f"row_slice [{start}, {start + count}) cuts a {self.tile_rows}-row tile")
        tiles = slice(start // self.tile_rows, (start + count) // self.tile_rows)
        return Nvfp4Codes(self.data[start:start + count], self.scales[tiles], self.decode, self.tile_rows)

    def t(self) -> "Nvfp4Codes":
        """The transposed operand: a 16x16 tile is a tile of the transpose, with the same scale."""
        if self.tile_rows != BLOCK:
            raise ValueError("only 16x16 tiles transpose: a 1x16 block is not a block of the transpose")
        data = self.transposed_data if self.transposed_data is not None else pack_codes(self.codes().t())
        return Nvfp4Codes(data, self.scales.t(), self.decode, BLOCK, self.data)

    def operand(self) -> Nvfp4Operand:
        """Padded to a multiple of 32 along the reduction (unless the codes already are), scales per 1x16 block,
        swizzled."""
        reduction = self.reduction
        padded = -(-reduction // REDUCTION_MULTIPLE) * REDUCTION_MULTIPLE
        scales = self.scales if self.tile_rows == 1 else self.scales.repeat_interleave(BLOCK, dim=0)
        data = self.data
        if data.shape[1] not in (reduction // 2, padded // 2):
            raise ValueError(f"Nvfp4Codes: packed codes {list(data.shape)} for a reduction of {reduction}")
        if padded != reduction:  # zero codes under a zero scale: exact zeros in every sum
            if data.shape[1] != padded // 2:
                data = F.pad(data, (0, (padded - reduction) // 2))
            scales = F.pad(scales, (0, (padded - reduction) // BLOCK))
        return Nvfp4Operand(data, swizzle_scales(scales), self.decode.reshape(()), reduction)
