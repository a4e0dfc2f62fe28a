"""Context parallelism over a built model: each cp rank holds a contiguous piece of every sequence.

    apply_context_parallel(model, cp_mesh_or_group, seq_len=None) -> dict   sets the cp group on every
                                                              Mamba2Mixer and Attention (after tensor
                                                              parallelism, before activation checkpointing,
                                                              compile and FSDP2); with seq_len, checks L / cp
    check_local_length(seq_len, size, min_local_tokens=1) -> int   L / cp, or ValueError naming the numbers
    context_parallel_slice(tensor, rank, size, dim=1)         the rank's piece of a [B, L, ...] batch tensor
                                                              (inputs and labels)
    context_parallel_collectives(cfg, batch, local_tokens, tp=1)   every collective of one micro-batch's
                                                              forward with its message shape and dtype

Rank r of the cp group holds tokens [r L/cp, (r+1) L/cp) of each sequence; the mixers exchange only what
crosses a piece boundary (models/context_parallel.py: the formulas). Per micro-batch forward, per Mamba layer
an all-gather of the conv halo (b, K-1, ch) in the activation dtype and one of the piece's end state and log
decay, b H (P N + 1) fp32; per attention layer an all-gather of K and V, (2, b, Hkv, L/cp, hd) in the
activation dtype. Backward: the reduce-scatter (sum) of each, in reverse. MLP blocks, norms, embeddings and
the LM head run on the local tokens with no communication. With activation checkpointing a recomputed block
issues its forward all-gathers again during the backward.

The loss: each rank's logits are those of its own tokens; a rank's parameter gradients are the sums over its
tokens, and their sum over the cp group (FSDP2 reduces over dp_shard x cp) is the whole sequence's. With a
mean loss per rank, a mean over the dp x cp ranks is the batch's mean, every piece holding L/cp tokens.

What L/cp must satisfy: at least K-1 tokens (the conv's halo comes from the one rank before;
models.context_parallel raises otherwise), best a multiple of ModelConfig.chunk_size (else each rank's scan
pads its last chunk); under tensor parallelism also a multiple of tp (trainer.validate).
"""

from __future__ import annotations

from typing import Dict, List

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from models.attention import Attention
from models.config import ModelConfig
from models.context_parallel import ContextParallel
from models.mamba2 import Mamba2Mixer


def apply_context_parallel(model: nn.Module, cp_mesh_or_group, seq_len: int | None = None) -> dict:
    """Give every Mamba2Mixer and Attention of ``model`` the cp group (a 1-D DeviceMesh or a ProcessGroup).

    ``seq_len`` (optional): the sequence length L the model will see whole; then L / cp is checked here
    (ValueError: divisible, at least K-1 tokens) and the attention mask of the rank's piece built ahead, outside
    any compiled graph (models.context_parallel.ContextParallel.attention_mask).

    Returns what the caller logs and the planner checks: ``degree``; ``forward_all_gathers`` and
    ``backward_reduce_scatters`` per micro-batch (2 per Mamba layer + 1 per attention layer each; 0 at degree 1,
    where nothing is set); ``mamba_layers``, ``attention_layers``; ``min_local_tokens`` (K-1: the fewest
    tokens a rank's piece may hold)."""
    group = cp_mesh_or_group.get_group() if isinstance(cp_mesh_or_group, DeviceMesh) else cp_mesh_or_group
    holder = ContextParallel(group)
    mamba = [module for module in model.modules() if isinstance(module, Mamba2Mixer)]
    attention = [module for module in model.modules() if isinstance(module, Attention)]
    min_local = max(mamba[0].config.conv_kernel - 1, 1) if mamba else 1
    if seq_len is not None:
        local = check_local_length(seq_len, holder.size, min_local)
        if attention and holder.size > 1:
            holder.build_attention_mask(local)
    if holder.size > 1:  # at degree 1 the mixers keep None: their unsplit path, no collective
        for module in mamba + attention:
            module.context_parallel = holder
    gathers = 2 * len(mamba) + len(attention) if holder.size > 1 else 0
    return {"degree": holder.size, "forward_all_gathers": gathers, "backward_reduce_scatters": gathers,
            "mamba_layers": len(mamba), "attention_layers": len(attention), "min_local_tokens": min_local}


def check_local_length(seq_len: int, size: int, min_local_tokens: int = 1) -> int:
    """L / cp, the tokens of a rank's piece; ValueError naming the numbers unless cp divides L and the piece
    holds at least ``min_local_tokens`` (the conv's K-1)."""
    if seq_len % size:
        raise ValueError(f"context parallelism: the sequence length {seq_len} is not divisible by cp={size} "
                         f"(each rank takes L / cp consecutive tokens)")
    if seq_len // size < min_local_tokens:
        raise ValueError(f"context parallelism: a rank's piece of {seq_len} / {size} = {seq_len // size} tokens is "
                         f"shorter than the conv's K-1 = {min_local_tokens} tokens passed on to the next rank")
    return seq_len // size


def context_parallel_slice(tensor: torch.Tensor, rank: int, size: int, dim: int = 1) -> torch.Tensor:
    """The rank's contiguous piece along ``dim`` (the tokens of [B, L, ...]): [rank L/size, (rank+1) L/size)."""
    share = check_local_length(tensor.shape[dim], size)
    return tensor.narrow(dim, rank * share, share)


def context_parallel_collectives(cfg: ModelConfig, batch: int, local_tokens: int, tp: int = 1) -> List[Dict]:
    """The all-gathers of one micro-batch's forward in issue order (the backward reduce-scatters the same messages
    in reverse order), each {"layer", "what", "shape", "dtype"}: ``shape`` is what one rank sends (the gathered
    tensor is cp of them), ``dtype`` "activation" (the mixer's compute dtype) or "float32". Heads and conv
    channels are a tp rank's share. For cp > 1; at cp == 1 there are none."""
    messages = []
    conv_channels = (cfg.mamba_inner_size + 2 * cfg.mamba_num_groups * cfg.ssm_state_size) // tp
    heads = cfg.mamba_num_heads // tp
    for layer, symbol in enumerate(cfg.pattern):
        if symbol == "M":
            messages.append({"layer": layer, "what": "conv_halo", "shape": (batch, cfg.conv_kernel - 1, conv_channels),
                             "dtype": "activation"})
            messages.append({"layer": layer, "what": "ssd_state", "dtype": "float32",
                             "shape": (batch * heads * (cfg.mamba_head_dim * cfg.ssm_state_size + 1),)})
        elif symbol == "*":
            messages.append({"layer": layer, "what": "attention_kv", "dtype": "activation",
                             "shape": (2, batch, cfg.num_key_value_heads // tp, local_tokens, cfg.attention_head_dim)})
    return messages
