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

Initialization (Megatron / mamba_ssm): in_proj ~ N(0, init_std), out_proj ~ N(0, residual std);
conv1d weight and bias as nn.Conv1d's default (kaiming-uniform a=sqrt(5), i.e. U(+-1/sqrt(K))
for a depthwise kernel); dt_bias = softplus^-1(dt) with dt log-uniform in
[time_step_min, time_step_max], floored at time_step_floor; A_log = log(U[A_init_min, A_init_max]);
D = 1; norm weight = 1. A_log, D and dt_bias take no weight decay.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from models.config import ModelConfig
from models.kernels import causal_conv, mamba_ssm_triton, resolve_backend, resolve_conv_backend
from models.norms import GatedRMSNorm
from models.ssd import ssd_chunked

NO_WEIGHT_DECAY_PARAMS = ("A_log", "D", "dt_bias")


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

        self.in_proj = nn.Linear(cfg.hidden_size, projection_size, bias=False)
        # Depthwise causal conv over [x, B, C]. Stored as nn.Conv1d for Hugging Face's layout
        # (weight (conv_dim, 1, K), bias (conv_dim,)); forward uses its tensors functionally.
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
        self.mark_no_weight_decay()

    def mark_no_weight_decay(self) -> None:
        """Set ``_no_weight_decay`` on A_log, D, dt_bias (lost whenever a Parameter is replaced)."""
        for name in NO_WEIGHT_DECAY_PARAMS:
            getattr(self, name)._no_weight_decay = True

    @torch.no_grad()
    def init_weights(self, residual_std: float) -> None:
        cfg = self.config
        nn.init.normal_(self.in_proj.weight, mean=0.0, std=cfg.init_std)
        nn.init.normal_(self.out_proj.weight, mean=0.0, std=residual_std)
        # nn.Conv1d's own default init (reset_parameters): kaiming-uniform weight, uniform bias.
        self.conv1d.reset_parameters()
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
        projected = self.in_proj(hidden_states)  # (b, L, d + conv_dim + H)
        # One split (its backward is a single cat), views into `projected`.
        z, xBC, dt = torch.split(projected, [self.inner_size, self.conv_dim, self.num_heads], dim=-1)

        conv_weight = self.conv1d.weight.squeeze(1)  # (conv_dim, K)
        if resolve_conv_backend(self.config.conv_backend, device) == "compiled":
            xBC = causal_conv.compiled_causal_conv1d_silu(xBC, conv_weight, self.conv1d.bias)
        else:
            xBC = causal_conv.causal_conv1d_silu_conv1d(xBC, conv_weight, self.conv1d.bias)

        group_width = self.num_groups * self.state_size
        x, B, C = torch.split(xBC, [self.inner_size, group_width, group_width], dim=-1)
        x = x.unflatten(-1, (self.num_heads, self.head_dim))  # (b, L, H, P)
        B = B.unflatten(-1, (self.num_groups, self.state_size))  # (b, L, G, N)
        C = C.unflatten(-1, (self.num_groups, self.state_size))
        A = -torch.exp(self.A_log.float())  # (H,), < 0

        if resolve_backend(self.config.ssd_backend, device, "ssd_backend") == "triton":
            clamp = self.config.time_step_clamp_min
            y = mamba_ssm_triton.chunk_scan(
                x, dt, A, B, C, self.chunk_size,
                D=self.D.float(), dt_bias=self.dt_bias.float(), dt_softplus=True,
                dt_limit=(clamp, float("inf")),
            )
        else:
            y = ssd_chunked(
                x, dt, A, B, C, self.chunk_size,
                D=self.D, dt_bias=self.dt_bias, dt_softplus=True, dt_min=self.config.time_step_clamp_min,
            )
        y = self.norm(y.flatten(-2), z)  # (b, L, d), gated by z
        return self.out_proj(y)
