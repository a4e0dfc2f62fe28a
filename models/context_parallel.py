"""Context parallelism (CP): the three sequence-mixing ops that need tokens of other ranks.

cp ranks split every sequence of a micro-batch into contiguous pieces: rank r holds tokens
[r Lc, (r+1) Lc), Lc = L / cp. Per-token work (linears, norms, MLP, gated norm) runs on the local
tokens unchanged; only these cross a piece boundary (b batch, ch the rank's conv channels, H heads
(a tensor-parallel rank's share), P head dim, N state, Hkv kv heads, hd attention head dim):

1. Mamba conv halo. The causal conv of width K reads the K-1 pre-conv xBC tokens before t:

       y[t] = silu(bias + sum_{k=0}^{K-1} w[k] xBC[t - (K-1) + k])

   Rank r prepends rank r-1's last K-1 tokens (rank 0: zeros, the conv's own zero padding), runs
   the unchanged conv on K-1+Lc tokens and drops the first K-1 outputs.
   Collective: all-gather of (b, K-1, ch), activation dtype.

2. Mamba SSD state passing (models/ssd.py's recurrence S_t = exp(a_t) S_{t-1} + dt_t x_t B_t^T,
   y_t = S_t C_t + D x_t, a_t = dt_t A, dt discretized exactly as the scans do: ``discretize_dt``).
   The local scan starts from S = 0, which is right on rank 0 only. With t counted from the piece's
   start, each rank computes its piece's own end state and total log decay

       S_r = sum_s exp(sum_{k=s+1}^{Lc-1} a_k) dt_s x_s B_s^T     (b, H, P, N)
       l_r = sum_t a_t                                            (b, H)

   all-gathers them, forms the state entering its piece

       h_r = sum_{j<r} exp(sum_{k=j+1}^{r-1} l_k) S_j              (h_0 = 0)

   and adds what that state contributes (the unrolled recurrence, split at the piece's start):

       y_t += exp(sum_{k=0}^{t} a_k) C_t . h_r

   Decays are exponentials of direct sums over their own segments (a flipped cumsum for the suffix
   sums, ``models.ssd.segment_sum`` across pieces), never differences of long prefix sums (models/ssd.py).
   The correction runs in fp32 (fp64 for fp64 inputs) with autocast off, added to the scan's y (which
   holds D x already) and cast back to y's dtype, as the scan casts.
   Collective: all-gather of one flat tensor [S_r, l_r], b H (P N + 1) elements, fp32.

3. Attention K/V (no position embeddings in Nemotron-H). Rank r gathers every rank's K and V, keeps
   tokens [0, (r+1) Lc) and runs SDPA with the lower-right causal mask: query i of the piece sees
   keys j <= i + r Lc. Collective: all-gather of K and V stacked, (2, b, Hkv, Lc, hd), activation dtype.

So per micro-batch: 2 all-gathers per Mamba layer and 1 per attention layer forward, and as many
reduce-scatters (sum; the all-gather's gradient) backward. Nothing else communicates. Every rank
keeps the gathered tensor in its graph, even where it uses none of it (rank 0's halo and entering
state are selected from a stack shifted by one rank, not built from nothing), so each rank reaches
each backward reduce-scatter and the collectives stay matched across the group.

Why contiguous pieces: the Mamba recurrence runs in token order, so a piece's entering state is
a function of the pieces before it and one all-gather of small states passes it. The price is
attention's uneven causal load: rank r's queries see (r+1) Lc keys, (2r+1)/cp^2 of the causal work
(rank cp-1 does (2cp-1)/cp^2, about 2/cp), acceptable because attention is a small share of the
hybrid's work (one block in several).

What Lc must satisfy: Lc >= K-1 (the halo comes from the one rank before; checked here,
ValueError). Any Lc >= K-1 is correct for both scans (models.ssd.ssd_chunked pads the last chunk,
mamba_ssm's kernel masks it), but an Lc that is a multiple of ModelConfig.chunk_size wastes no
padded chunk per rank.
"""

from __future__ import annotations

from typing import Callable, Tuple

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right
from torch.utils._python_dispatch import _disable_current_modes

from models.ssd import discretize_dt, segment_sum

# torch 2.13 renamed the functional collectives (the *_tensor names warn as deprecated); older torch has only
# the old names. Same semantics either way (models/quant/sequence_gather.py).
_all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
_reduce_scatter = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor


class ContextParallel:
    """The cp group of a mixer: ``group`` (ProcessGroup), this process's ``rank`` in it and its ``size``, and
    the attention masks of its pieces. A plain attribute of the mixers (``context_parallel``), set by
    trainer.context_parallel."""

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.masks = {}  # piece length Lc -> causal_lower_right(Lc, (rank+1) Lc)

    def attention_mask(self, length: int):
        """SDPA's lower-right causal mask of this rank's piece of ``length`` tokens (a CausalBias: no mask in memory).

        Built once per length and kept: a CausalBias is a tensor subclass, which cannot be constructed inside a
        torch.compile graph (Dynamo refuses the constructor) nor under a TorchDispatchMode (CommDebugMode, a
        FLOP counter: the empty tensor it wraps comes back from the mode already wrapped). A kept one passes
        through both. ``build_attention_mask`` makes it ahead (trainer.context_parallel does, given the
        sequence length); otherwise the first forward does, eagerly (one graph break, once)."""
        mask = self.masks.get(length)
        return self.build_attention_mask(length) if mask is None else mask

    @torch.compiler.disable
    def build_attention_mask(self, length: int):
        with _disable_current_modes():
            self.masks[length] = causal_lower_right(length, (self.rank + 1) * length)
        return self.masks[length]

    def __deepcopy__(self, memo):
        return self  # a copied model talks to the same group (a ProcessGroup cannot be copied)

    def __repr__(self) -> str:
        return f"ContextParallel(rank={self.rank}, size={self.size})"


class _AllGather(torch.autograd.Function):
    """All-gather along dim 0; backward: reduce-scatter (sum) along dim 0. Written out, as
    trainer.tensor_parallel's are, so the gradient reaches the collective contiguous."""

    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return funcol.wait_tensor(_all_gather(tensor.contiguous(), gather_dim=0, group=group))

    @staticmethod
    def backward(ctx, grad):
        return funcol.wait_tensor(_reduce_scatter(grad.contiguous(), "sum", scatter_dim=0, group=ctx.group)), None


def all_gather(tensor: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
    """Every rank's ``tensor`` stacked in rank order: (...) -> (cp, ...); the message is ``tensor`` itself."""
    return _AllGather.apply(tensor.unsqueeze(0), cp.group)


def _shifted(stacked: torch.Tensor, rank: int) -> torch.Tensor:
    """stacked[rank - 1], zeros for rank 0, taken from the stack shifted by one rank: the gathered tensor stays
    in rank 0's graph too, so its backward (the reduce-scatter the other ranks wait in) runs there as well."""
    return torch.cat([torch.zeros_like(stacked[:1]), stacked[:-1]])[rank]


# ----------------------------------------------------------------------------------------------
# 1. Mamba conv halo


def conv_with_halo(conv: Callable, xBC: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                   cp: ContextParallel) -> torch.Tensor:
    """``conv(xBC, weight, bias)`` (models.kernels.causal_conv: (b, T, ch), (ch, K), (ch,) -> (b, T, ch), silu
    applied) of the rank's piece as the unsplit sequence's conv computes it: xBC (b, Lc, ch) -> (b, Lc, ch)."""
    halo = weight.shape[-1] - 1
    length = xBC.shape[1]
    if length < halo:
        raise ValueError(f"context parallelism: a rank's piece holds {length} tokens, fewer than the conv's "
                         f"K-1 = {halo} it passes on to the next rank (need L / cp >= {halo})")
    tails = all_gather(xBC[:, length - halo:], cp)  # (cp, b, K-1, ch): every rank's last K-1 tokens
    extended = torch.cat([_shifted(tails, cp.rank), xBC], dim=1)  # (b, K-1+Lc, ch)
    # The conv pads K-1 zeros before the halo; its first K-1 outputs (the halo's own, silu'd) read them, so
    # they are dropped. Output t of the piece reads only extended[t : t + K], the halo and the piece.
    return conv(extended, weight, bias)[:, halo:]


# ----------------------------------------------------------------------------------------------
# 2. Mamba SSD state passing (plain torch; dt discretized, in the compute dtype)


def _heads_by_group(tensor: torch.Tensor, groups: int) -> torch.Tensor:
    """(b, L, H, ...) -> (b, L, G, R, ...): head h = g R + r uses group g (models/ssd.py's layout)."""
    return tensor.unflatten(2, (groups, tensor.shape[2] // groups))


def piece_end_state(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The state a zero-started scan of the piece ends in, and its total log decay.

    x (b, Lc, H, P); dt (b, Lc, H) discretized; A (H,); B (b, Lc, G, N) -> S (b, H, P, N), l (b, H), dt's dtype.
    """
    compute = dt.dtype
    log_decay = dt * A.to(compute)  # a_t <= 0, (b, Lc, H)
    # to_end[s] = sum_{k=s+1}^{Lc-1} a_k: an inclusive suffix cumsum (flipped), moved one step; 0 at the end.
    suffix = log_decay.flip(1).cumsum(1).flip(1)
    to_end = F.pad(suffix[:, 1:], (0, 0, 0, 1))
    groups = B.shape[2]
    weight = _heads_by_group(torch.exp(to_end) * dt, groups)  # (b, s, g, r)
    state = torch.einsum("bsgr,bsgrp,bsgn->bgrpn", weight, _heads_by_group(x.to(compute), groups), B.to(compute))
    return state.flatten(1, 2), log_decay.sum(1)


def entering_states(states: torch.Tensor, log_decays: torch.Tensor) -> torch.Tensor:
    """The state entering each piece: states (n, b, H, P, N), log_decays (n, b, H) of n consecutive pieces ->
    (n, b, H, P, N), h_i = sum_{j<i} exp(sum_{k=j+1}^{i-1} l_k) S_j (zero for the first piece)."""
    carry = torch.exp(segment_sum(log_decays.permute(1, 2, 0)))  # (b, H, i, j): exp(sum_{k=j+1}^{i} l_k), j <= i
    leaving = torch.einsum("bhij,jbhpn->ibhpn", carry, states)  # the state each piece ends in
    return torch.cat([torch.zeros_like(leaving[:1]), leaving[:-1]])


def state_correction(y: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, C: torch.Tensor,
                     entering: torch.Tensor) -> torch.Tensor:
    """y (b, Lc, H, P), a zero-started scan's output, plus what the entering state (b, H, P, N) adds:
    y_t + exp(sum_{k<=t} a_k) C_t . h. dt (b, Lc, H) discretized; C (b, Lc, G, N). Returns y's dtype."""
    compute = dt.dtype
    groups = C.shape[2]
    decay = torch.exp((dt * A.to(compute)).cumsum(1))  # (b, Lc, H): from the piece's start through t
    heads = entering.unflatten(1, (groups, entering.shape[1] // groups))  # (b, g, r, p, n)
    added = torch.einsum("btgn,bgrpn->btgrp", C.to(compute), heads) * _heads_by_group(decay, groups).unsqueeze(-1)
    return (y.to(compute) + added.flatten(2, 3)).to(y.dtype)


def pass_ssd_states(y: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                    C: torch.Tensor, cp: ContextParallel, dt_bias: torch.Tensor | None = None,
                    dt_softplus: bool = True, dt_min: float = 0.0) -> torch.Tensor:
    """The unsplit scan's output on the rank's piece, from the local zero-started scan's ``y``.

    Arguments as the scan took them (models.ssd.ssd_chunked): x (b, Lc, H, P); dt (b, Lc, H) raw;
    A (H,); B, C (b, Lc, G, N); dt_bias, dt_softplus, dt_min. mamba_ssm's kernel discretizes dt the same
    way (softplus with threshold 20, then its dt_limit's lower bound) up to the last bit of exp/log."""
    with torch.autocast(device_type=x.device.type, enabled=False):  # fp32 einsums, whatever the autocast
        dt = discretize_dt(dt, dt_bias, dt_softplus, dt_min)  # (b, Lc, H), fp32 (fp64 stays fp64)
        state, log_decay = piece_end_state(x, dt, A, B)
        gathered = all_gather(torch.cat([state.flatten(), log_decay.flatten()]), cp)  # (cp, b H (P N + 1))
        states = gathered[:, :state.numel()].unflatten(1, state.shape)  # (cp, b, H, P, N)
        log_decays = gathered[:, state.numel():].unflatten(1, log_decay.shape)  # (cp, b, H)
        entering = entering_states(states, log_decays)[cp.rank]
        return state_correction(y, dt, A, C, entering)


# ----------------------------------------------------------------------------------------------
# 3. Attention over the gathered K/V


def gathered_kv_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: ContextParallel,
                          enable_gqa: bool) -> torch.Tensor:
    """Causal SDPA of the piece's queries over the keys and values of tokens [0, (r+1) Lc).

    q (b, Hq, Lc, hd); k, v (b, Hkv, Lc, hd) -> (b, Hq, Lc, hd). The mask is
    ``causal_lower_right(Lc, (r+1) Lc)``: query i sees keys j <= i + r Lc (rank 0: SDPA's is_causal). It takes
    enable_gqa: where the flash kernel runs (CUDA, fp16/bf16) it is called with its own causal flag (lower-right
    when Lq < Lk) and the K/V heads as they are (flash's GQA is native); elsewhere SDPA gets the mask
    materialized and enable_gqa passed on. So K/V heads are never repeated, and no (Lc, (r+1) Lc) mask is built
    for flash, which no explicit mask could use. (Seen on an H100, torch 2.11: bf16 and fp16 ran flash's kernels,
    fp32 the materialized mask; outputs and gradients matched repeated heads with a boolean mask.)"""
    batch, kv_heads, length, head_dim = k.shape
    kv = all_gather(torch.stack([k, v]), cp)  # (cp, 2, b, Hkv, Lc, hd)
    visible = cp.rank + 1
    # Slicing the pieces before the permute copies only the visible ones (rank 0: no copy at all).
    kv = kv[:visible].permute(1, 2, 3, 0, 4, 5).reshape(2, batch, kv_heads, visible * length, head_dim)
    return F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=cp.attention_mask(length), enable_gqa=enable_gqa)
