"""The project's own chunked SSD (Mamba-2 state-space duality) scan in plain PyTorch.

The recurrence it computes (per batch b, head h; x_t in R^P, B_t, C_t in R^N of the head's
group; dt_t > 0 and A < 0 scalars; state S_t in R^{P x N}):

    S_t = exp(dt_t * A) * S_{t-1} + dt_t * x_t B_t^T          (S_{-1} = 0)
    y_t = S_t C_t + D * x_t

with dt_t = softplus(dt_raw_t + dt_bias) (optionally clamped from below). Unrolled,

    y_t = sum_{s <= t} (C_t . B_s) * exp(sum_{k=s+1}^{t} dt_k A) * dt_s x_s + D x_t

The chunked algorithm (Dao & Gu 2024, "Transformers are SSMs", section 6) splits time into
chunks of Q steps and evaluates this sum in four vectorised pieces, never looping over time:

1. within a chunk: a masked (Q x Q) "attention" (C_t . B_s) * decay(t <- s) applied to dt x;
2. each chunk's own end state: sum_s decay(end <- s) dt_s x_s B_s^T;
3. across chunks: the state leaving chunk i is sum_{j <= i} decay(end of i <- end of j) * state_j,
   a (chunks x chunks) matrix product; chunk c starts from the state leaving chunk c - 1;
4. from the carried-in state: y_t += exp(decay from the chunk start through t) * C_t . state_in.

Decays are exponentials of segment sums sum_{k=s+1}^{t} a_k, built by a masked cumulative
sum over each segment (not as a difference of two long prefix sums, which loses precision
when the prefixes are large). All arithmetic is fp32; the result is cast to x's dtype,
as mamba_ssm's Triton kernel returns it (fp64 inputs are computed in fp64, for tests).

Heads and groups: H heads share B and C in G groups of R = H / G consecutive heads (head h
uses group h // R), the layout of mamba_ssm and Hugging Face's NemotronH.

Shapes below: b batch, c chunk, t/s step within a chunk (target/source), g group, r head
within group, p head channel, n state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def segment_sum(values: torch.Tensor) -> torch.Tensor:
    """out[..., i, j] = sum_{k=j+1}^{i} values[..., k] for i >= j (0 on the diagonal), -inf above it.

    values: (..., L) -> (..., L, L). Each entry is a direct sum over its own segment.
    """
    length = values.shape[-1]
    rows = values.unsqueeze(-1).expand(*values.shape, length)  # rows[..., i, j] = values[..., i]
    strictly_below = torch.ones(length, length, dtype=torch.bool, device=values.device).tril(-1)
    summed = rows.masked_fill(~strictly_below, 0.0).cumsum(dim=-2)  # sum over k in (j, i]
    causal = torch.ones(length, length, dtype=torch.bool, device=values.device).tril()
    return summed.masked_fill(~causal, float("-inf"))


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def discretize_dt(
    dt: torch.Tensor,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = True,
    dt_min: float = 0.0,
) -> torch.Tensor:
    """dt = softplus(dt_raw + dt_bias), clamped below at dt_min when dt_min > 0; fp32 (fp64 stays fp64)."""
    dt = dt.to(_compute_dtype(dt))
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    if dt_min > 0:
        dt = dt.clamp(min=dt_min)
    return dt


def ssd_chunked(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = True,
    dt_min: float = 0.0,
) -> torch.Tensor:
    """Chunked SSD scan from a zero initial state.

    x: (batch, seqlen, heads, head_dim); dt: (batch, seqlen, heads) before bias/softplus;
    A: (heads,) negative; B, C: (batch, seqlen, groups, state); D: (heads,) or None;
    dt_bias: (heads,) or None. Returns y: (batch, seqlen, heads, head_dim) in x's dtype.
    Same arguments and result as mamba_ssm's ``mamba_chunk_scan_combined`` (z=None).
    """
    batch, seqlen, heads, head_dim = x.shape
    groups, state = B.shape[-2], B.shape[-1]
    if heads % groups != 0:
        raise ValueError(f"ssd_chunked: groups ({groups}) must divide heads ({heads})")
    if dt.shape != (batch, seqlen, heads) or B.shape != (batch, seqlen, groups, state) or C.shape != B.shape:
        raise ValueError(
            f"ssd_chunked: shapes disagree: x {tuple(x.shape)}, dt {tuple(dt.shape)}, B {tuple(B.shape)}, C {tuple(C.shape)}"
        )
    per_group = heads // groups

    dt = discretize_dt(dt, dt_bias, dt_softplus, dt_min)  # (b, L, h) fp32
    # Pad the tail of the last chunk with zeros (dt = 0 there): outputs at real steps depend
    # only on earlier steps, so the padding changes nothing; it is cropped at the end.
    pad = (-seqlen) % chunk_size
    compute = _compute_dtype(x)
    dt = dt.to(compute)
    xf, Bf, Cf = x.to(compute), B.to(compute), C.to(compute)
    if pad:
        xf = F.pad(xf, (0, 0, 0, 0, 0, pad))
        Bf = F.pad(Bf, (0, 0, 0, 0, 0, pad))
        Cf = F.pad(Cf, (0, 0, 0, 0, 0, pad))
        dt = F.pad(dt, (0, 0, 0, pad))
    chunks = (seqlen + pad) // chunk_size
    Q = chunk_size

    xs = xf.view(batch, chunks, Q, groups, per_group, head_dim)  # (b, c, s, g, r, p)
    Bs = Bf.view(batch, chunks, Q, groups, state)  # (b, c, s, g, n)
    Cs = Cf.view(batch, chunks, Q, groups, state)  # (b, c, t, g, n)
    dts = dt.view(batch, chunks, Q, groups, per_group)  # (b, c, s, g, r)
    x_dt = xs * dts.unsqueeze(-1)  # dt_s * x_s

    # Per-step log decay a_s = dt_s * A <= 0, time last: (b, c, g, r, Q).
    log_decay = (dts * A.to(compute).view(groups, per_group)).permute(0, 1, 3, 4, 2)

    # 1. Within-chunk outputs. decay[t, s] = exp(sum_{k=s+1}^{t} a_k), zero for s > t.
    decay = torch.exp(segment_sum(log_decay))  # (b, c, g, r, t, s)
    scores = torch.einsum("bctgn,bcsgn->bcgts", Cs, Bs)  # C_t . B_s, shared by a group's heads
    y_diag = torch.einsum("bcgts,bcgrts,bcsgrp->bctgrp", scores, decay, x_dt)

    # 2. Each chunk's end state from its own inputs: decay from s to the chunk's last step.
    decay_to_end = decay[..., -1, :]  # (b, c, g, r, s)
    chunk_states = torch.einsum("bcgrs,bcsgrp,bcsgn->bcgrpn", decay_to_end, x_dt, Bs)

    # 3. Carry states across chunks. The state leaving chunk i is
    #    sum_{j <= i} exp(sum_{k=j+1}^{i} chunk_decay_k) * chunk_states_j; chunk c starts from
    #    the state leaving chunk c - 1 (zero for the first chunk).
    chunk_decay = log_decay.sum(dim=-1).permute(0, 2, 3, 1)  # (b, g, r, c)
    carry = torch.exp(segment_sum(chunk_decay))  # (b, g, r, i, j)
    leaving = torch.einsum("bgrij,bjgrpn->bigrpn", carry, chunk_states)
    entering = torch.cat([torch.zeros_like(leaving[:, :1]), leaving[:, :-1]], dim=1)  # (b, c, g, r, p, n)

    # 4. Outputs from the carried-in state, decayed from the chunk start through step t.
    decay_from_start = torch.exp(log_decay.cumsum(dim=-1))  # (b, c, g, r, t)
    y_off = torch.einsum("bctgn,bcgrpn,bcgrt->bctgrp", Cs, entering, decay_from_start)

    y = y_diag + y_off
    if D is not None:
        y = y + xs * D.to(compute).view(groups, per_group, 1)
    y = y.reshape(batch, chunks * Q, heads, head_dim)[:, :seqlen]
    return y.to(x.dtype)
