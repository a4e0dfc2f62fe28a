"""Causal depthwise conv1d followed by SiLU, on (batch, time, channels) activations.

Formula (per channel c, kernel width K, weight w[c, k], bias b[c]; x is zero before t = 0):

    y[t, c] = silu( b[c] + sum_{k=0}^{K-1} w[c, k] * x[t - (K-1) + k, c] )

which is ``F.conv1d(x^T, w[:, None, :], b, padding=K-1, groups=C)[..., :T]`` — the
cross-correlation nn.Conv1d computes, cropped to the causal part (Mamba-2, mamba_ssm,
Hugging Face's NemotronH).

Two implementations:
- ``causal_conv1d_silu_conv1d``: eager ``F.conv1d`` on a channels-first transpose; the
  reference, and the CPU path.
- ``causal_conv1d_silu_shifted``: the same sum written as K shifted multiply-adds in the
  (batch, time, channels) layout, accumulated in fp32. Eager it is K small elementwise
  kernels; under ``torch.compile`` (``compiled_causal_conv1d_silu``) Inductor fuses the
  forward into one pass over x and the backward into a few, with no transposes. That is
  the GPU path: it reads the strided [x, B, C] slice of in_proj's output directly.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


def causal_conv1d_silu_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Reference. x: (B, T, C); weight: (C, K); bias: (C,) -> (B, T, C), contiguous, x's dtype."""
    seq_len = x.shape[1]
    kernel = weight.shape[-1]
    y = F.conv1d(x.transpose(1, 2), weight.unsqueeze(1).to(x.dtype), bias.to(x.dtype), padding=kernel - 1, groups=x.shape[-1])
    return F.silu(y[..., :seq_len]).transpose(1, 2).contiguous()


def causal_conv1d_silu_shifted(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Shift-and-add form. x: (B, T, C) (any strides); weight: (C, K); bias: (C,) -> (B, T, C)."""
    seq_len = x.shape[1]
    kernel = weight.shape[-1]
    # Zero history before t = 0: pad K-1 steps at the front of the time axis.
    padded = F.pad(x, (0, 0, kernel - 1, 0))  # (B, T + K - 1, C)
    weight = weight.float()
    acc = bias.float() + padded[:, 0:seq_len].float() * weight[:, 0]
    for k in range(1, kernel):  # K (= 4) unrolled terms, not a loop over time
        acc = acc + padded[:, k : k + seq_len].float() * weight[:, k]
    return F.silu(acc).to(x.dtype)


@functools.lru_cache(maxsize=None)
def _compiled():
    # dynamic=False: one specialisation per shape, as training uses one shape.
    return torch.compile(causal_conv1d_silu_shifted, dynamic=False, fullgraph=True)


def compiled_causal_conv1d_silu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``causal_conv1d_silu_shifted`` under torch.compile (traced inline when already compiling)."""
    if torch.compiler.is_compiling():
        return causal_conv1d_silu_shifted(x, weight, bias)
    return _compiled()(x, weight, bias)
