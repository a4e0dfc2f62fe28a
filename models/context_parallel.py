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

       S_r = sum_s w_s x_s B_s^T,  w_s = exp(sum_{k=s+1}^{Lc-1} a_k) dt_s       (b, H, P, N)
       l_r = sum_t a_t                                                      (b, H)

   all-gathers them, forms the state entering its piece

       h_r = sum_{j<r} exp(sum_{k=j+1}^{r-1} l_k) S_j              (h_0 = 0)

   and adds what that state contributes (the unrolled recurrence, split at the piece's start):

       y_t += exp(sum_{k=0}^{t} a_k) C_t . h_r

   Decays are exponentials of direct sums over their own segments (flipped cumsums for the suffix
   sums), never differences of long prefix sums (models/ssd.py).
   Dtypes, as mamba_ssm's Triton kernels do it (chunk_state scales B by its fp32 decay and casts it to
   the input dtype before the dot; chunk_scan casts the entering state to C's dtype before
   ``dot(C, prev_states)``): dt, the log decays, their cumsums and exponentials are fp32 (per token and
   head); the two products are batched matmuls per (batch, group) in the input dtype of x, B, C (bf16
   under FSDP's bf16 params) with fp32 accumulation and an fp32 result (torch.bmm's out_dtype on CUDA):
   S_r = (w x)^T B, w x formed in fp32 and cast once to x's dtype (x rather than B: H P per token, not
   H N); C h_r with h_r cast to C's dtype, scaled by its fp32 decay and added to y in fp32, cast once
   to y's dtype. S_r, l_r, the gathered stack and h_r are fp32. fp64 inputs run everything in fp64
   (tests). The per-head decays are laid out (b, H, t), so their cumsums run along the last dim.
   Three autograd Functions (end state, fold, correction); the end state's and the correction's backward
   recompute the decays (and w x, C h_r) from the saved inputs:
   - matmul FLOPs per Mamba layer and micro-batch, input dtype (t = Lc, d = H P of the rank): forward
     4 b t d N (S_r: 2; C h: 2), backward 10 b t d N (dx, dB: 4; dh, dC: 4; C h again for the decays'
     gradient: 2); besides O(b t d) fp32 elementwise work.
   - saved for backward: references to the tensors given (x, dt, dt_bias, A, B, C; mamba_ssm's scan
     keeps the same ones; models.ssd's torch scan keeps fp32 copies instead, so there the references
     keep the bf16 ones alive), nothing else per token; per layer h_r in the input dtype (b H P N), the
     fold's copy of S_0 .. S_{r-2} (fp32, (r-1) b H P N; S_{r-1} enters with weight 1) and its weights
     (fp32, r b H). Nothing keeps the gathered tensor (the all-gather's autograd saves nothing).
   Collective: all-gather of one flat tensor [S_r, l_r], b H (P N + 1) elements, fp32.

3. Attention K/V (no position embeddings in Nemotron-H). Rank r gathers every rank's K and V, keeps
   tokens [0, (r+1) Lc) and runs SDPA with the lower-right causal mask: query i of the piece sees
   keys j <= i + r Lc. Collective: all-gather of K and V stacked, (2, b, Hkv, Lc, hd), activation dtype.

So per micro-batch: 2 all-gathers per Mamba layer and 1 per attention layer forward, and as many
reduce-scatters (sum; the all-gather's gradient) backward. Nothing else communicates. Every rank
keeps the gathered tensor in its graph, even where it uses none of it (rank 0's halo is selected from
a stack shifted by one rank, not built from nothing; its zero entering state comes out of the fold,
which takes the gathered states and gives them zero gradients), so each rank reaches each backward
reduce-scatter and the collectives stay matched across the group.

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
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right
from torch.utils._python_dispatch import _disable_current_modes

from models.collectives import all_gather as all_gather_along
from models.ssd import discretize_dt

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


def all_gather(tensor: torch.Tensor, cp: ContextParallel) -> torch.Tensor:
    """Every rank's ``tensor`` stacked in rank order: (...) -> (cp, ...); the message is ``tensor`` itself;
    backward: the reduce-scatter (sum) of the stack's gradient."""
    return all_gather_along(tensor.unsqueeze(0), 0, cp.group)


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
# 2. Mamba SSD state passing: three autograd Functions (end state, fold, correction) around one all-gather


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (n, i, k) @ b (n, k, j) in the operands' dtype, accumulated and returned in fp32 (fp64 stays fp64).

    bf16/fp16 on CUDA: cuBLAS on tensor cores, fp32 accumulator written as fp32 (torch.bmm's out_dtype), as
    mamba_ssm's ``tl.dot`` keeps its fp32 accumulator. CPU has no bmm out_dtype: half operands are widened to fp32
    first, which gives the same products (a product of two bf16 or fp16 values is exact in fp32); tests only."""
    if a.dtype in (torch.float16, torch.bfloat16):
        if a.device.type == "cuda":
            return torch.bmm(a, b, out_dtype=torch.float32)
        return torch.bmm(a.float(), b.float())
    return torch.bmm(a, b)


def _dense(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous copy of ``tensor`` (any strides) in ``dtype``: cast and re-laid out in one copy."""
    out = torch.empty(tensor.shape, dtype=dtype, device=tensor.device)
    return out.copy_(tensor)


def _product(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """a * b (broadcast), computed in the promoted dtype (fp32 for a bf16 a and an fp32 b), contiguous, cast once
    to ``dtype``. Eagerly one kernel writing into the result (no fp32 intermediate in memory); under torch.compile
    the plain product and copy, which inductor fuses (an out= buffer's strides do not survive its tracing)."""
    if torch.compiler.is_compiling():
        return _dense(a * b, dtype)
    out = torch.empty(torch.broadcast_shapes(a.shape, b.shape), dtype=dtype, device=a.device)
    torch.mul(a, b, out=out)
    return out


def _sum_of_product(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """a + b * c as ``_product`` computes a product: the promoted dtype, contiguous, cast once to ``dtype``."""
    if torch.compiler.is_compiling():
        return _dense(a + b * c, dtype)
    out = torch.empty(torch.broadcast_shapes(a.shape, b.shape, c.shape), dtype=dtype, device=a.device)
    torch.addcmul(a, b, c, out=out)
    return out


def _group_major(tensor: torch.Tensor, groups: int) -> torch.Tensor:
    """(b, t, H, ...) -> (b, G, t, R, ...), a view: head h = g R + r uses group g (models/ssd.py's layout)."""
    return tensor.unflatten(2, (groups, tensor.shape[2] // groups)).transpose(1, 2)


def _by_group(tensor: torch.Tensor) -> torch.Tensor:
    """B or C (b, t, G, N) -> (b G, t, N), contiguous, its dtype: each group's tokens as one matrix."""
    batch, length, groups, state = tensor.shape
    return _dense(tensor.transpose(1, 2), tensor.dtype).reshape(batch * groups, length, state)


def _dt_grads(grad_dt: torch.Tensor, dt: torch.Tensor, dt_bias, dt_softplus: bool, dt_min: float):
    """The gradients of dt_raw (b, t, H) and dt_bias (H,) (or None), in their dtypes, from that of the discretized
    dt (b, t, H), through the derivatives torch's autograd takes of ``discretize_dt``: softplus's is 1 above its
    threshold 20, else sigmoid; the clamp's is 1 where softplus's value >= dt_min, else 0."""
    raw = discretize_dt(dt, dt_bias, dt_softplus=False)  # dt_raw + dt_bias, the compute dtype
    grad = grad_dt
    if dt_softplus:
        grad = torch.where(raw > 20, grad, grad * torch.sigmoid(raw))
        raw = F.softplus(raw)
    if dt_min > 0:
        grad = grad * (raw >= dt_min)
    grad_bias = None if dt_bias is None else grad.sum((0, 1)).to(dt_bias.dtype)
    return grad.to(dt.dtype), grad_bias


def _no_autocast(tensor: torch.Tensor):
    return torch.autocast(device_type=tensor.device.type, enabled=False)


def _log_decays(dt: torch.Tensor, A: torch.Tensor, dt_bias, dt_softplus: bool, dt_min: float
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The discretized dt and a = dt A, head-major (b, H, t) and contiguous, so that their cumsums run along the
    last dim (CUDA's scan along the middle dim of (b, t, H) is a slow kernel). dt is discretized in its own
    (b, t, H) layout, exactly as the scans do it; fp32 (fp64 stays fp64)."""
    discrete = discretize_dt(dt, dt_bias, dt_softplus, dt_min).transpose(1, 2).contiguous()
    return discrete, discrete * A.to(discrete.dtype).unsqueeze(-1)


def _group_major_heads(values: torch.Tensor, groups: int) -> torch.Tensor:
    """A per-head value (b, H, t) as a view broadcasting over _group_major's (b, G, t, R, P)."""
    batch, heads, length = values.shape
    return values.view(batch, groups, heads // groups, length).transpose(2, 3).unsqueeze(-1)


def _token_major_heads(values: torch.Tensor, groups: int) -> torch.Tensor:
    """A per-head value (b, H, t) as a view broadcasting over (b, t, G, R, P), the layout of x and y."""
    batch, heads, length = values.shape
    return values.view(batch, groups, heads // groups, length).permute(0, 3, 1, 2).unsqueeze(-1)


def _to_end(log_decay: torch.Tensor) -> torch.Tensor:
    """to_end[s] = sum_{k=s+1}^{t-1} a_k along the last dim: an inclusive suffix cumsum (flipped), moved one
    step; 0 at the end."""
    suffix = log_decay.flip(-1).cumsum(-1).flip(-1)
    return F.pad(suffix[..., 1:], (0, 1))


class _PieceEndState(torch.autograd.Function):
    """S = sum_s exp(sum_{k=s+1}^{t-1} a_k) dt_s x_s B_s^T (fp32), l = sum_s a_s, of a zero-started piece.

    The matmul runs in x's dtype per (batch, group): (R P, t) @ (t, N), x scaled by its fp32 weight and cast
    once (mamba_ssm's chunk_state scales and casts B the same way). Saved: x, dt_raw, dt_bias, A, B, the
    tensors given (no copies); backward recomputes the decays and the scaled x."""

    @staticmethod
    def forward(ctx, x, dt, dt_bias, A, B, dt_softplus, dt_min):
        batch, length, heads, head_dim = x.shape
        groups, state = B.shape[2], B.shape[3]
        with _no_autocast(x):
            discrete, log_decay = _log_decays(dt, A, dt_bias, dt_softplus, dt_min)  # (b, H, t)
            weight = torch.exp(_to_end(log_decay)) * discrete
            scaled = _product(_group_major(x, groups), _group_major_heads(weight, groups), x.dtype)
            scaled = scaled.reshape(batch * groups, length, -1)  # (b G, t, R P), x's dtype
            end = _bmm(scaled.transpose(1, 2), _by_group(B))  # (b G, R P, N)
        ctx.save_for_backward(x, dt, dt_bias, A, B)
        ctx.discretization = (dt_softplus, dt_min)
        return end.view(batch, heads, head_dim, state), log_decay.sum(-1)

    @staticmethod
    def backward(ctx, grad_state, grad_log_decay):
        x, dt, dt_bias, A, B = ctx.saved_tensors
        batch, length, heads, head_dim = x.shape
        groups = B.shape[2]
        with _no_autocast(x):
            discrete, log_decay = _log_decays(dt, A, dt_bias, *ctx.discretization)
            to_end = torch.exp(_to_end(log_decay))
            weight = to_end * discrete  # (b, H, t)
            x_by_group = _group_major(x, groups)  # (b, G, t, R, P), a view
            scaled = _product(x_by_group, _group_major_heads(weight, groups), x.dtype)
            scaled = scaled.reshape(batch * groups, length, -1)  # (b G, t, R P)
            grad = grad_state.to(x.dtype).reshape(batch * groups, -1, grad_state.shape[-1])  # (b G, R P, N)
            grad_B = _bmm(scaled, grad).view(batch, groups, length, -1).transpose(1, 2)
            grad_scaled = _bmm(_by_group(B), grad.transpose(1, 2)).view(x_by_group.shape)  # fp32
            grad_x = _product(grad_scaled.transpose(1, 2), _token_major_heads(weight, groups), x.dtype)
            # d/d weight_s = sum_p grad_scaled x_s (fp32); weight_s = exp(to_end_s) dt_s.
            grad_weight = (grad_scaled * x_by_group).sum(-1).transpose(2, 3).reshape(weight.shape)
            grad_to_end = grad_weight * weight  # to_end_s sums a_k over k > s
            grad_log = F.pad(grad_to_end.cumsum(-1)[..., :-1], (1, 0)) + grad_log_decay.unsqueeze(-1)
            grad_dt = grad_weight * to_end + grad_log * A.to(discrete.dtype).unsqueeze(-1)
            grad_A = (grad_log * discrete).sum((0, 2)).to(A.dtype)
            grad_raw, grad_bias = _dt_grads(grad_dt.transpose(1, 2), dt, dt_bias, *ctx.discretization)
        return grad_x.reshape(x.shape), grad_raw, grad_bias, grad_A, _dense(grad_B, B.dtype), None, None


class _EnteringState(torch.autograd.Function):
    """h_r = sum_{j<r} exp(sum_{k=j+1}^{r-1} l_k) S_j from the gathered pieces' states (n, b, H, P, N) and log
    decays (n, b, H), fp32. Saved: a copy of S_0 .. S_{r-2} (the gradient of l_k is sum_{j<k} c_j <dh, S_j>;
    S_{r-1}'s weight is 1) and the weights c_j, not the gathered tensor: (r-1) b H P N fp32 elements."""

    @staticmethod
    def forward(ctx, states, log_decays, rank):
        # e_j = sum_{k=j+1}^{r-1} l_k (j < r): a suffix cumsum of l_1 .. l_{r-1}, then e_{r-1} = 0
        suffix = log_decays[1:rank].flip(0).cumsum(0).flip(0)
        weights = torch.exp(torch.cat([suffix, torch.zeros_like(log_decays[:min(rank, 1)])]))  # (r, b, H)
        entering = (weights[..., None, None] * states[:rank]).sum(0) if rank else torch.zeros_like(states[0])
        ctx.save_for_backward(states[:max(rank - 1, 0)].clone(), weights)
        ctx.rank, ctx.pieces = rank, states.shape[0]
        return entering

    @staticmethod
    def backward(ctx, grad):
        earlier, weights = ctx.saved_tensors
        rank = ctx.rank
        grad_states = grad.new_zeros(ctx.pieces, *grad.shape)
        grad_states[:rank] = weights[..., None, None] * grad
        grad_log_decays = grad.new_zeros(ctx.pieces, *grad.shape[:2])
        if rank > 1:  # d/d l_k = sum_{j<k} c_j <dh, S_j>, k = 1 .. r-1
            grad_log_decays[1:rank] = ((grad * earlier).sum((-2, -1)) * weights[:-1]).cumsum(0)
        return grad_states, grad_log_decays, None


class _StateCorrection(torch.autograd.Function):
    """y_t + exp(sum_{k<=t} a_k) C_t . h in y's dtype.

    C_t . h runs in C's dtype per (batch, group): (t, N) @ (N, R P), h cast to it (mamba_ssm's chunk_scan casts
    its entering state to C's dtype the same way), the fp32 result scaled by the fp32 decay and added to y in
    fp32, then cast once. Saved: dt_raw, dt_bias, A, C (the tensors given) and h in C's dtype (b H P N); backward
    recomputes the decays and C . h (for the decays' gradient)."""

    @staticmethod
    def forward(ctx, y, dt, dt_bias, A, C, entering, dt_softplus, dt_min):
        batch, length, heads, head_dim = y.shape
        groups = C.shape[2]
        with _no_autocast(y):
            _, log_decay = _log_decays(dt, A, dt_bias, dt_softplus, dt_min)
            decay = torch.exp(log_decay.cumsum(-1))  # (b, H, t): from the piece's start through t
            cast = entering.to(C.dtype)
            added = _bmm(_by_group(C), cast.view(batch * groups, -1, cast.shape[-1]).transpose(1, 2))  # (b G, t, R P)
            added = added.view(batch, groups, length, heads // groups, head_dim).transpose(1, 2)  # (b, t, G, R, P)
            out = _sum_of_product(y.unflatten(2, added.shape[2:4]), _token_major_heads(decay, groups), added,
                                  y.dtype).reshape(y.shape)  # y + decay C . h in fp32, cast once
        ctx.save_for_backward(dt, dt_bias, A, C, cast)
        ctx.discretization = (dt_softplus, dt_min)
        return out

    @staticmethod
    def backward(ctx, grad):
        dt, dt_bias, A, C, cast = ctx.saved_tensors
        batch, length, heads, head_dim = grad.shape
        groups = C.shape[2]
        with _no_autocast(grad):
            discrete, log_decay = _log_decays(dt, A, dt_bias, *ctx.discretization)
            decay = torch.exp(log_decay.cumsum(-1))  # (b, H, t)
            grad_added = _product(_group_major(grad, groups), _group_major_heads(decay, groups), C.dtype)
            grad_added = grad_added.reshape(batch * groups, length, -1)  # (b G, t, R P)
            C_by_group = _by_group(C)
            entering = cast.reshape(batch * groups, -1, cast.shape[-1])  # (b G, R P, N)
            grad_entering = _bmm(grad_added.transpose(1, 2), C_by_group).view(cast.shape)  # fp32
            grad_C = _bmm(grad_added, entering).view(batch, groups, length, -1).transpose(1, 2)
            added = _bmm(C_by_group, entering.transpose(1, 2))  # C . h again, for d/d decay
            added = added.view(batch, groups, length, heads // groups, head_dim).transpose(1, 2)  # (b, t, G, R, P)
            grad_decay = (grad.unflatten(2, added.shape[2:4]) * added).sum(-1)  # (b, t, G, R), fp32
            grad_cumsum = grad_decay.permute(0, 2, 3, 1).reshape(decay.shape) * decay  # (b, H, t)
            grad_log = grad_cumsum.flip(-1).cumsum(-1).flip(-1)  # a_k enters every cumsum from k on
            grad_A = (grad_log * discrete).sum((0, 2)).to(A.dtype)
            grad_dt = (grad_log * A.to(discrete.dtype).unsqueeze(-1)).transpose(1, 2)
            grad_raw, grad_bias = _dt_grads(grad_dt, dt, dt_bias, *ctx.discretization)
        return grad, grad_raw, grad_bias, grad_A, _dense(grad_C, C.dtype), grad_entering, None, None


def piece_end_state(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, dt_bias=None,
                    dt_softplus: bool = True, dt_min: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """The state a zero-started scan of the piece ends in, and its total log decay.

    x (b, t, H, P); dt (b, t, H) raw, discretized here as the scans do (dt_bias, dt_softplus, dt_min); A (H,);
    B (b, t, G, N) -> S (b, H, P, N), l (b, H), fp32 (fp64 for fp64 inputs)."""
    return _PieceEndState.apply(x, dt, dt_bias, A, B, dt_softplus, dt_min)


def entering_state(states: torch.Tensor, log_decays: torch.Tensor, rank: int) -> torch.Tensor:
    """The state entering piece ``rank`` of n consecutive pieces: states (n, b, H, P, N), log decays (n, b, H) ->
    (b, H, P, N), h_r = sum_{j<r} exp(sum_{k=j+1}^{r-1} l_k) S_j (zero for the first piece)."""
    return _EnteringState.apply(states, log_decays, rank)


def state_correction(y: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, C: torch.Tensor, entering: torch.Tensor,
                     dt_bias=None, dt_softplus: bool = True, dt_min: float = 0.0) -> torch.Tensor:
    """y (b, t, H, P), a zero-started scan's output, plus what the entering state (b, H, P, N) adds:
    y_t + exp(sum_{k<=t} a_k) C_t . h. dt (b, t, H) raw (discretized here as the scans do); C (b, t, G, N).
    Returns y's dtype."""
    return _StateCorrection.apply(y, dt, dt_bias, A, C, entering, dt_softplus, dt_min)


def pass_ssd_states(y: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                    C: torch.Tensor, cp: ContextParallel, dt_bias: torch.Tensor | None = None,
                    dt_softplus: bool = True, dt_min: float = 0.0) -> torch.Tensor:
    """The unsplit scan's output on the rank's piece, from the local zero-started scan's ``y``.

    Arguments as the scan took them (models.ssd.ssd_chunked): x (b, Lc, H, P); dt (b, Lc, H) raw;
    A (H,); B, C (b, Lc, G, N); dt_bias, dt_softplus, dt_min. mamba_ssm's kernel discretizes dt the same
    way (softplus with threshold 20, then its dt_limit's lower bound) up to the last bit of exp/log."""
    state, log_decay = piece_end_state(x, dt, A, B, dt_bias, dt_softplus, dt_min)
    gathered = all_gather(torch.cat([state.flatten(), log_decay.flatten()]), cp)  # (cp, b H (P N + 1)), fp32
    states = gathered[:, :state.numel()].unflatten(1, state.shape)  # (cp, b, H, P, N)
    log_decays = gathered[:, state.numel():].unflatten(1, log_decay.shape)  # (cp, b, H)
    entering = entering_state(states, log_decays, cp.rank)
    return state_correction(y, dt, A, C, entering, dt_bias, dt_softplus, dt_min)


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
