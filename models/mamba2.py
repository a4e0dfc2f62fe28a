"""Mamba-2 mixer with the layout of Nemotron-H (Megatron ``MambaMixer``, HF ``NemotronHMamba2Mixer``).

With d = heads * head_dim, G groups, N state size, H heads, K conv width:

    [z, xBC, dt] = in_proj(u)                  widths [d, d + 2 G N, H]   (one GEMM, no bias)
    xBC          = silu(causal_depthwise_conv1d(xBC) + conv_bias)   (width K; see kernels.causal_conv)
    [x, B, C]    = xBC                          widths [d, G N, G N]
    dt           = softplus(dt + dt_bias)       (clamped below at time_step_clamp_min when > 0)
    A            = -exp(A_log)
    y            = SSD(x, dt, A, B, C) + D * x  (chunked scan; models.ssd or mamba_ssm's Triton kernel)
    y            = rmsnorm_g(y * silu(z)) * norm.weight   per group of d / G channels
    out          = out_proj(y)

Parameter layout: GROUP-MAJOR (``IN_PROJ_LAYOUT``). Group g owns heads [g H/G, (g+1) H/G), so the
channels [g d/G, (g+1) d/G) of z and x, B_g and C_g (N each) and dt's [g H/G, (g+1) H/G). Our
in_proj rows and conv1d channels are stored group by group:

    in_proj rows     [z_0, x_0, B_0, C_0, dt_0,  z_1, x_1, B_1, C_1, dt_1,  ...]   widths per group
                     [d/G, d/G, N, N, H/G], G groups: 2 d + 2 G N + H rows in all
    conv1d channels  [x_0, B_0, C_0,  x_1, B_1, C_1,  ...]                          (weight (C, 1, K), bias (C,))

Hugging Face's and Megatron's checkpoints store the canonical order instead, in_proj [z, x, B, C,
dt] and conv [x, B, C] (each part itself ordered by group); ``in_proj_group_major_index`` and
``conv_group_major_index`` give the row permutation (``ours = canonical[index]``), which models.hf
applies on import and inverts on export. With G = 1 both orders are the same. Why: tensor
parallelism splits the mixer by groups, and in this order a rank's share of in_proj, conv1d, dt_bias,
A_log, D and the gated norm's weight is one contiguous slice (``Shard(0)``) for every degree dividing
G, so distributed checkpoints reshard between degrees without any permutation. The forward
de-interleaves with views: (b, L, groups * width) -> (b, L, groups, width) -> split the last dim;
it reads the number of groups from in_proj's output, so one code runs the whole mixer and a
tensor-parallel rank's share (parameters may be DTensors: ``norms.local_tensor``). Under context
parallelism (``context_parallel`` set, models.context_parallel) the mixer holds a contiguous piece of
each sequence: the conv reads the K-1 tokens before it from the previous rank, and the zero-started
scan's output gains what the state entering the piece contributes.

Initialization (Megatron / mamba_ssm): in_proj ~ N(0, init_std), out_proj ~ N(0, residual std);
conv1d weight and bias as nn.Conv1d's default (kaiming-uniform a=sqrt(5), i.e. U(+-1/sqrt(K))
for a depthwise kernel); dt_bias = softplus^-1(dt) with dt log-uniform in
[time_step_min, time_step_max], floored at time_step_floor; A_log = log(U[A_init_min, A_init_max]);
D = 1; norm weight = 1. A_log, D and dt_bias take no weight decay. in_proj and conv1d are drawn in
the canonical order and permuted into group-major, so a seed gives the same model, value for value,
as the canonical layout did.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from models.config import ModelConfig
from models.context_parallel import conv_with_halo, pass_ssd_states
from models.kernels import causal_conv, mamba_ssm_triton, resolve_backend, resolve_conv_backend
from models.norms import GatedRMSNorm, local_tensor
from models.ssd import ssd_chunked

NO_WEIGHT_DECAY_PARAMS = ("A_log", "D", "dt_bias")

IN_PROJ_LAYOUT = "group_major"
"""How in_proj's rows and conv1d's channels are ordered (module docstring); checkpoints may record it."""


def _group_major(parts, groups: int) -> torch.Tensor:
    """Row indices: for each group g, each part's g-th slice. ``parts``: (start, width per group) of
    each canonical part, in the group-major order within a group."""
    return torch.cat([torch.arange(start + g * width, start + (g + 1) * width)
                      for g in range(groups) for start, width in parts])


def in_proj_group_major_index(cfg: ModelConfig) -> torch.Tensor:
    """Our in_proj row r is row ``index[r]`` of the canonical [z, x, B, C, dt] in_proj (HF, Megatron)."""
    d, G, N, H = cfg.mamba_inner_size, cfg.mamba_num_groups, cfg.ssm_state_size, cfg.mamba_num_heads
    return _group_major([(0, d // G), (d, d // G), (2 * d, N), (2 * d + G * N, N), (2 * d + 2 * G * N, H // G)], G)


def conv_group_major_index(cfg: ModelConfig) -> torch.Tensor:
    """Our conv1d channel c is channel ``index[c]`` of the canonical [x, B, C] conv1d."""
    d, G, N = cfg.mamba_inner_size, cfg.mamba_num_groups, cfg.ssm_state_size
    return _group_major([(0, d // G), (d, N), (d + G * N, N)], G)


def inverse_index(index: torch.Tensor) -> torch.Tensor:
    """The permutation undoing ``index``: ``ours[inverse_index(index)]`` is canonical again."""
    return torch.argsort(index)


class Mamba2Mixer(nn.Module):
    """Mamba-2 token mixer: (batch, seq, hidden) -> (batch, seq, hidden)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.hidden_size = cfg.hidden_size
        self.num_heads = cfg.mamba_num_heads
        self.head_dim = cfg.mamba_head_dim
        self.num_groups = cfg.mamba_num_groups
        self.state_size = cfg.ssm_state_size
        self.chunk_size = cfg.chunk_size
        self.inner_size = cfg.mamba_inner_size
        self.conv_dim = self.inner_size + 2 * self.num_groups * self.state_size
        projection_size = self.inner_size + self.conv_dim + self.num_heads  # [z, xBC, dt]
        # Per group: in_proj rows [z_g, x_g, B_g, C_g, dt_g], conv channels [x_g, B_g, C_g].
        self.group_inner = self.inner_size // self.num_groups
        self.group_heads = self.num_heads // self.num_groups
        self.group_conv = self.group_inner + 2 * self.state_size
        self.group_projection = self.group_inner + self.group_conv + self.group_heads

        self.in_proj = nn.Linear(cfg.hidden_size, projection_size, bias=False)
        # Depthwise causal conv over [x, B, C] (group-major). Stored as nn.Conv1d for Hugging Face's
        # layout (weight (conv_dim, 1, K), bias (conv_dim,)); forward uses its tensors functionally.
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, cfg.conv_kernel, groups=self.conv_dim, padding=cfg.conv_kernel - 1, bias=True
        )
        self.dt_bias = nn.Parameter(torch.empty(self.num_heads))
        self.A_log = nn.Parameter(torch.empty(self.num_heads))
        self.D = nn.Parameter(torch.empty(self.num_heads))
        self.norm = GatedRMSNorm(
            self.inner_size, self.inner_size // self.num_groups, eps=cfg.norm_eps, backend=cfg.gated_norm_backend
        )
        self.out_proj = nn.Linear(self.inner_size, cfg.hidden_size, bias=False)
        # models.context_parallel.ContextParallel when the sequence is split over ranks (a plain attribute,
        # set by trainer.context_parallel; None: the whole sequence is here).
        self.context_parallel = None
        self.mark_no_weight_decay()

    def mark_no_weight_decay(self) -> None:
        """Set ``_no_weight_decay`` on A_log, D, dt_bias (lost whenever a Parameter is replaced)."""
        for name in NO_WEIGHT_DECAY_PARAMS:
            getattr(self, name)._no_weight_decay = True

    @torch.no_grad()
    def init_weights(self, residual_std: float) -> None:
        cfg = self.config
        weight = self.in_proj.weight
        canonical = torch.empty_like(weight)  # drawn in the canonical order, then permuted
        nn.init.normal_(canonical, mean=0.0, std=cfg.init_std)
        weight.copy_(canonical[in_proj_group_major_index(cfg).to(weight.device)])
        del canonical
        nn.init.normal_(self.out_proj.weight, mean=0.0, std=residual_std)
        # nn.Conv1d's own default init (reset_parameters): kaiming-uniform weight, uniform bias.
        self.conv1d.reset_parameters()
        conv_index = conv_group_major_index(cfg).to(self.conv1d.weight.device)
        self.conv1d.weight.copy_(self.conv1d.weight[conv_index])
        self.conv1d.bias.copy_(self.conv1d.bias[conv_index])
        device = self.dt_bias.device
        log_min, log_max = math.log(cfg.time_step_min), math.log(cfg.time_step_max)
        dt = torch.exp(torch.rand(self.num_heads, device=device) * (log_max - log_min) + log_min)
        dt = dt.clamp(min=cfg.time_step_floor)
        # Inverse of softplus: softplus(dt + log(-expm1(-dt))) = dt.
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        A = torch.empty(self.num_heads, device=device).uniform_(cfg.A_init_min, cfg.A_init_max)
        self.A_log.copy_(torch.log(A))
        self.D.fill_(1.0)
        self.norm.init_weights()
        self.mark_no_weight_decay()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        device = hidden_states.device
        projected = self.in_proj(hidden_states)  # (b, L, groups * group_projection)
        batch, seqlen, width = projected.shape
        groups = width // self.group_projection  # G, or a tensor-parallel rank's G / tp
        # (b, L, groups, [z_g, xBC_g, dt_g]): views; a reshape below copies only when groups > 1.
        z, xBC, dt = torch.split(projected.view(batch, seqlen, groups, self.group_projection),
                                 [self.group_inner, self.group_conv, self.group_heads], dim=-1)
        z = z.reshape(batch, seqlen, groups * self.group_inner)
        dt = dt.reshape(batch, seqlen, groups * self.group_heads)
        xBC = xBC.reshape(batch, seqlen, groups * self.group_conv)

        conv_weight = local_tensor(self.conv1d.weight).squeeze(1)  # (channels, K)
        conv_bias = local_tensor(self.conv1d.bias)
        if resolve_conv_backend(self.config.conv_backend, device) == "compiled":
            conv = causal_conv.compiled_causal_conv1d_silu
        else:
            conv = causal_conv.causal_conv1d_silu_conv1d
        cp = self.context_parallel
        if cp is None:
            xBC = conv(xBC, conv_weight, conv_bias)
        else:  # the K-1 tokens before this rank's piece come from the rank before
            xBC = conv_with_halo(conv, xBC, conv_weight, conv_bias, cp)

        x, B, C = torch.split(xBC.view(batch, seqlen, groups, self.group_conv),
                              [self.group_inner, self.state_size, self.state_size], dim=-1)
        x = x.reshape(batch, seqlen, groups * self.group_heads, self.head_dim)  # (b, L, H, P)
        # B, C: (b, L, groups, N)
        A_log, D, dt_bias = local_tensor(self.A_log), local_tensor(self.D), local_tensor(self.dt_bias)
        A = -torch.exp(A_log.float())  # (H,), < 0

        clamp = self.config.time_step_clamp_min
        if resolve_backend(self.config.ssd_backend, device, "ssd_backend") == "triton":
            y = mamba_ssm_triton.chunk_scan(
                x, dt, A, B, C, self.chunk_size,
                D=D.float(), dt_bias=dt_bias.float(), dt_softplus=True,
                dt_limit=(clamp, float("inf")),
            )
        else:
            y = ssd_chunked(
                x, dt, A, B, C, self.chunk_size,
                D=D, dt_bias=dt_bias, dt_softplus=True, dt_min=clamp,
            )
        if cp is not None:  # the scan started from zero: add what the state entering this rank's piece adds
            y = pass_ssd_states(y, x, dt, A, B, C, cp, dt_bias=dt_bias, dt_softplus=True, dt_min=clamp)
        y = self.norm(y.flatten(-2), z)  # (b, L, d), gated by z
        return self.out_proj(y)
