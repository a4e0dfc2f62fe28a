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


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, dim, group):
        ctx.dim, ctx.group = dim, group
        return _gather(tensor, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _scatter(grad, ctx.dim, ctx.group), None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, dim, group):
        ctx.dim, ctx.group = dim, group
        return _scatter(tensor, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, ctx.dim, ctx.group), None, None


def all_gather(tensor: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Every rank's ``tensor`` joined along ``dim`` in rank order; backward: the gradient's reduce-scatter (sum)."""
    return _AllGather.apply(tensor, dim, group)


def reduce_scatter(tensor: torch.Tensor, dim: int, group) -> torch.Tensor:
    """The ranks' ``tensor`` summed, this rank's slice of ``dim`` (1/size of it); backward: the gradient's
    all-gather."""
    return _ReduceScatter.apply(tensor, dim, group)
