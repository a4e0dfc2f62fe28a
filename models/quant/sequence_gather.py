"""Operands moved along the sequence under sequence parallelism: gathers of a rank's rows or columns, scatters.

Each tp rank holds t = T / tp tokens of every sequence: x [B, t, K]. A column-parallel layer needs X of all B T
tokens, a row-parallel one dY of all of them (its output's gradient). Gathering them in BF16 moves 2 bytes an
element and has every rank quantize all B T tokens again; gathering the quantized operands moves the packed
codes and the block scales, 1/2 + 1/16 byte an element, and each rank quantizes its own t tokens
(models.quant.nvfp4_torch). Quantized with the group's amax (``quantized_linear.GATHERED_INPUT_OPERANDS``,
``SCATTERED_OUTPUT_OPERANDS``), the gathered codes are those of the gathered tensor, bit for bit: row blocks
(X, dY: 1x16) run along the features within a token, column blocks (X^T, dY^T, after the RHT, whose 16-tiles
are blocks too) along the tokens of one sequence, never across a rank's share when t is a multiple of 16.
Here: the gathers and scatters themselves (torch's functional collectives, differentiable by the caller's
autograd function), dtype-agnostic, and a row-parallel GEMM pipelined with its reduce-scatter a sequence at a
time (``gemm_reduce_scatter``: NCCL moves one sequence's sums while the next sequence's GEMM runs).
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.distributed._functional_collectives as funcol

from models.collectives import all_gather_async as _all_gather, reduce_scatter_async as _reduce_scatter

BLOCK = 16
"""A quantization block's length along the tokens: each rank's share holds whole blocks."""


def gather_sequence(rows: Tuple[torch.Tensor, ...], columns: Tuple[torch.Tensor, ...], batch: int, group):
    """One all-gather along the sequence of a rank's operands, in the gathered tokens' order (each sequence's
    shares in rank order, as ``x.flatten(0, 1)`` of the gathered x [B, T, K] orders them):

    rows     [batch * t, w_i]      rows: the rank's tokens, sequence by sequence  -> [batch * T, w_i]
    columns  [r_j, batch * c_j]    columns: the rank's tokens (c_j bytes a sequence) -> [r_j, batch * tp * c_j]

    Returns (rows, columns) gathered. Everything travels in one flat buffer per sequence (uint8 codes and
    scales, or any one dtype)."""
    return launch_sequence_gather(rows, columns, batch, group)()


def launch_sequence_gather(rows: Tuple[torch.Tensor, ...], columns: Tuple[torch.Tensor, ...], batch: int, group):
    """``gather_sequence`` issued now and waited for by the function it returns: the caller computes meanwhile
    (NCCL runs the gather on its own stream)."""
    size = group.size()
    row_widths = [part.shape[1] for part in rows]
    column_shapes = [(part.shape[0], part.shape[1] // batch) for part in columns]
    flat = [part.reshape(batch, -1) for part in rows]  # [B, t * w]
    flat += [part.reshape(r, batch, c).transpose(0, 1).reshape(batch, -1) for part, (r, c) in zip(columns, column_shapes)]
    sizes = [piece.shape[1] for piece in flat]
    joined = torch.cat(flat, dim=1) if len(flat) > 1 else flat[0].contiguous()
    pending = _all_gather(joined, gather_dim=1, group=group)  # [B, tp * sum sizes], not waited for

    def result():
        pieces = funcol.wait_tensor(pending).reshape(batch, size, -1).split(sizes, dim=-1)  # each [B, tp, size_i]
        rows_out = tuple(piece.reshape(-1, width) for piece, width in zip(pieces, row_widths))
        columns_out = tuple(piece.reshape(batch, size, r, c).permute(2, 0, 1, 3).reshape(r, -1)
                            for piece, (r, c) in zip(pieces[len(rows):], column_shapes))
        return rows_out, columns_out

    return result


def gather_along_sequence(x: torch.Tensor, group) -> torch.Tensor:
    """x [B, t, K] -> [B T, K]: the sequence gathered in the input's dtype (for a GEMM in high precision)."""
    return funcol.wait_tensor(_all_gather(x.contiguous(), gather_dim=1, group=group)).reshape(-1, x.shape[-1])


def reduce_scatter_along_sequence(partial: torch.Tensor, batch: int, group):
    """Partial sums [B T, K] of every token -> this rank's [B, t, K] of their sum, issued now: the result is an
    async tensor, waited for (``funcol.wait_tensor``) where it is needed."""
    return _reduce_scatter(partial.reshape(batch, -1, partial.shape[-1]), "sum", scatter_dim=1, group=group)


def gemm_reduce_scatter(gemm_rows, rows: int, batch: int, group) -> torch.Tensor:
    """A row-parallel GEMM's partial sums of B T tokens ([rows, N], rows = B T, sequence by sequence) reduce-scattered
    to the rank's [B, t, N], a sequence at a time: ``gemm_rows(start, count)`` computes rows [start, start +
    count), and each sequence's reduce-scatter (along its rows: no copy before it) moves while the next one's
    GEMM runs. The same rows and sums as one GEMM and one reduce-scatter of the whole (on gloo bit for bit; a
    GPU's GEMM and NCCL may choose other kernels and summation orders for the smaller pieces)."""
    length = rows // batch
    pending = [_reduce_scatter(gemm_rows(s * length, length), "sum", scatter_dim=0, group=group)
               for s in range(batch)]
    pieces = [funcol.wait_tensor(piece) for piece in pending]  # [t, N] each
    return (pieces[0] if batch == 1 else torch.cat(pieces)).reshape(batch, -1, pieces[0].shape[-1])


def check_gathered_share(x: torch.Tensor, name: str, ranks: int) -> None:
    """ValueError unless x is [B, T, K] with T / ranks a multiple of 16: each rank's tokens hold whole blocks of
    X^T or dY^T (``ranks``: 1 for the rank's own input, tp for the whole sequence a row-parallel layer takes)."""
    if x.dim() != 3 or x.shape[1] % (BLOCK * ranks):
        raise ValueError(f"layer {name!r} gathers a sequence-parallel operand quantized: it takes [batch, tokens, "
                         f"features] with each rank's tokens a multiple of {BLOCK} (whole NVFP4 blocks along the "
                         f"tokens), got {list(x.shape)} over {ranks} rank(s)")
