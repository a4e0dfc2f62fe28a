"""Blocks of a 2D tensor: whether a shape divides into a format's tiles, blocked views, block maxima.

Every tensor is treated as 2D: leading dims are flattened into rows, blocks (tiles) run along the
last dim unless a 2D tile says otherwise. A dim that does not divide the tile raises ValueError;
nothing is ever padded.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from models.quant.element_formats import resolve_tile


def blocking_problem(shape, tile) -> Optional[str]:
    """Which dim of ``shape`` does not divide into ``tile``: 'rank', 'empty', 'last', 'leading'; None if all do."""
    if len(shape) == 0:
        return "rank"
    cols = shape[-1]
    rows = 1
    for dim in shape[:-1]:
        rows *= dim
    if rows * cols == 0:
        return "empty"
    if tile is None:
        return None
    if cols % tile[1] != 0:
        return "last"
    if rows % tile[0] != 0:
        return "leading"
    return None


def blockable(shape, fmt: str, tile) -> bool:
    """Whether ``shape`` divides into ``fmt`` tiles (``check_blockable`` without building a message)."""
    return blocking_problem(tuple(shape), resolve_tile(fmt, tile)) is None


def check_blockable(
    shape, fmt: str, tile, *, name: Optional[str] = None, dim_names: Optional[Tuple[str, str]] = None
) -> None:
    """Raise ValueError (naming ``name`` and the dim) unless ``shape`` divides into ``fmt`` tiles.

    Blocks run along the last dim; a 2D tile also needs the flattened leading dims to divide.
    ``dim_names`` (leading, last), e.g. ("out_features", "tokens"), label the dims in the message.
    The message is formatted only on failure (torch.compile then never reads ``name``).
    """
    tile = resolve_tile(fmt, tile)
    shape = tuple(shape)
    problem = blocking_problem(shape, tile)
    if problem is None:
        return
    where = f"{name}: " if name else ""
    if problem == "rank":
        raise ValueError(f"{where}cannot quantize a 0-dim tensor to {fmt}")
    if problem == "empty":
        raise ValueError(f"{where}cannot quantize an empty tensor of shape {list(shape)} to {fmt}")
    rows = 1
    for dim in shape[:-1]:
        rows *= dim
    if problem == "last":
        last_label = f" ({dim_names[1]})" if dim_names else ""
        raise ValueError(
            f"{where}last dim{last_label} {shape[-1]} (shape {list(shape)}) is not a multiple of the {fmt} block "
            f"length {tile[1]} (tile {tile[0]}x{tile[1]}); nothing is padded: change the size or keep "
            f"this tensor in high precision"
        )
    leading_label = f" ({dim_names[0]})" if dim_names else ""
    raise ValueError(
        f"{where}leading dim{leading_label} {rows} (shape {list(shape)}, leading dims flattened) is not a multiple "
        f"of the {fmt} tile height {tile[0]} (tile {tile[0]}x{tile[1]}); nothing is padded"
    )


def blocked_view(x2d: torch.Tensor, tile) -> torch.Tensor:
    """View [R, C] as [R/tr, tr, C/tc, tc] (per-tensor: [1, R, 1, C]); block reductions use dims (1, 3).

    Always a view, also of a transposed (column-major) ``x2d``: element-wise ops on it then keep
    that memory order, so a transposed operand is never copied into row-major order.
    """
    rows, cols = x2d.shape
    if tile is None:
        return x2d.reshape(1, rows, 1, cols)
    tile_rows, tile_cols = tile
    return x2d.reshape(rows // tile_rows, tile_rows, cols // tile_cols, tile_cols)


def block_amax(blocked: torch.Tensor) -> torch.Tensor:
    """max |x| per block (NaN if the block has a NaN), fp32, shape [R/tr, 1, C/tc, 1]."""
    return block_max(blocked.abs())


def block_max(blocked: torch.Tensor) -> torch.Tensor:
    """max per block of a blocked view [R/tr, tr, C/tc, tc] -> [R/tr, 1, C/tc, 1] (NaN propagates).

    A column-major (transposed) operand is reduced in its memory order, with the block columns
    outermost, so that the reduction runs along contiguous memory; the result is the same.
    """
    if blocked.stride(3) == 1:  # row-major: blocks along contiguous memory
        return blocked.amax(dim=(1, 3), keepdim=True)
    columns_first = blocked.permute(2, 3, 0, 1)  # [C/tc, tc, R/tr, tr]: row-major storage of x2d.t()
    return columns_first.amax(dim=(1, 3), keepdim=True).permute(2, 3, 0, 1)
