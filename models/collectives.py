"""Differentiable all-gather and reduce-scatter along one dim, for the tensor- and context-parallel passes.

    all_gather(x, dim)      every rank's x joined along dim in rank order;  backward: reduce-scatter (sum) along dim
    reduce_scatter(x, dim)  the sum over ranks of x, this rank's slice of dim; backward: all-gather along dim

Written out as autograd Functions over torch's functional collectives, rather than its *_autograd collectives,
whose backward hands NCCL the gradient as it comes (non-contiguous: an error). Both wait for their result.
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol

# torch 2.13 renamed the functional collectives (the *_tensor names warn as deprecated); older torch has only the
# old names. Same semantics either way.
all_gather_async = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
reduce_scatter_async = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor


def _gather(tensor: torch.Tensor, dim: int, group) -> torch.Tensor:
    return funcol.wait_tensor(all_gather_async(tensor.contiguous(), gather_dim=dim, group=group))


def _scatter(tensor: torch.Tensor, dim: int, group) -> torch.Tensor:
    return funcol.wait_tensor(reduce_scatter_async(tensor.contiguous(), "sum", scatter_dim=dim, group=group))


class _AlongDim(torch.autograd.Function):
    """One collective along ``dim`` (``gather``: all-gather, else reduce-scatter); backward: the other one."""

    @staticmethod
    def forward(ctx, tensor, dim, group, gather: bool):
        ctx.dim, ctx.group, ctx.gather = dim, group, gather
        return (_gather if gather else _scatter)(tensor, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return (_scatter if ctx.gather else _gather)(grad, ctx.dim, ctx.group), None, None, None


def all_gather(tensor: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Every rank's ``tensor`` joined along ``dim`` in rank order; backward: the gradient's reduce-scatter (sum)."""
    return _AlongDim.apply(tensor, dim, group, True)


def reduce_scatter(tensor: torch.Tensor, dim: int, group) -> torch.Tensor:
    """The ranks' ``tensor`` summed, this rank's slice of ``dim`` (1/size of it); backward: the gradient's
    all-gather."""
    return _AlongDim.apply(tensor, dim, group, False)
