"""Grouped-query causal self-attention of Nemotron-H (no position embeddings, no biases).

    q = x Wq^T  (heads Hq),  k = x Wk^T, v = x Wv^T  (heads Hkv, Hkv divides Hq)
    o = softmax(q k^T / sqrt(head_dim) + causal mask) v      query head i reads kv head i // (Hq/Hkv)
    out = o Wo^T

``scaled_dot_product_attention(..., is_causal=True, enable_gqa=True)`` runs it (the flash
kernel on GPU, the math kernel on CPU); the scale is SDPA's default 1/sqrt(head_dim), as in
Hugging Face's ``NemotronHAttention``. A packed window is one causal stream: no mask at
document boundaries (docs/ARCHITECTURE.md). Under context parallelism (``context_parallel`` set,
models.context_parallel) the queries of a rank's piece attend the gathered keys and values of every
token up to the piece's end.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.config import ModelConfig
from models.context_parallel import gathered_kv_attention


class Attention(nn.Module):
    """GQA self-attention: (batch, seq, hidden) -> (batch, seq, hidden)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.attention_head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=False)
        # models.context_parallel.ContextParallel when the sequence is split over ranks (a plain attribute,
        # set by trainer.context_parallel; None: the whole sequence is here).
        self.context_parallel = None

    @torch.no_grad()
    def init_weights(self, residual_std: float) -> None:
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.normal_(proj.weight, mean=0.0, std=self.config.init_std)
        nn.init.normal_(self.o_proj.weight, mean=0.0, std=residual_std)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        batch, seqlen, _ = hidden_states.shape
        # (b, L, heads * hd) -> (b, heads, L, hd): SDPA's layout (a view, last dim contiguous). The
        # head counts come from the projections' widths: all heads, or a tensor-parallel rank's
        # Hq/tp and Hkv/tp (query head i of the rank still reads its kv head i // (Hq / Hkv)).
        q = self.q_proj(hidden_states).view(batch, seqlen, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(batch, seqlen, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(batch, seqlen, -1, self.head_dim).transpose(1, 2)
        enable_gqa = self.num_kv_heads != self.num_heads
        if self.context_parallel is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=enable_gqa)
        else:  # this rank's queries over the keys and values of every token up to its piece's end
            out = gathered_kv_attention(q, k, v, self.context_parallel, enable_gqa)
        out = out.transpose(1, 2).reshape(batch, seqlen, -1)
        return self.o_proj(out)
