"""Squared-ReLU MLP of Nemotron-H (no gate, no biases): out = down_proj(relu(up_proj(x))^2)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.config import ModelConfig


class MLP(nn.Module):
    """(batch, seq, hidden) -> (batch, seq, hidden) through an ffn_hidden_size-wide squared ReLU."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.ffn_hidden_size, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_hidden_size, cfg.hidden_size, bias=False)

    @torch.no_grad()
    def init_weights(self, residual_std: float) -> None:
        nn.init.normal_(self.up_proj.weight, mean=0.0, std=self.config.init_std)
        nn.init.normal_(self.down_proj.weight, mean=0.0, std=residual_std)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.square(F.relu(self.up_proj(hidden_states))))
