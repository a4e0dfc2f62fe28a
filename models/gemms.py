"""Every GEMM of one training step of a hybrid model, from its dimensions alone (no module build).

One linear layer ``Y = X W^T`` with T tokens, K = in_features, N = out_features has three GEMMs,
each written ``C[M, N] = A[M, K] . B[K, N]`` (K the reduction dim):

    Fprop  Y  = X W^T      M = T    N = out  K = in
    Dgrad  dX = dY W       M = T    N = in   K = out
    Wgrad  dW = dY^T X     M = out  N = in   K = T

FLOPs = 2 M N K each, so a linear costs 6 T in out per step (the ``6 x parameters`` rule).

Linears, per block (names as in Hugging Face's NemotronH and models/, d = mamba heads x head dim,
G groups, S state, H mamba heads, h hidden, F ffn, Hq/Hkv attention heads of width a):
    Mamba-2    in_proj  h -> 2d + 2GS + H  ([z, x, B, C, dt]; 12B: 2*10240 + 2*8*128 + 128 = 22656)
               out_proj d -> h
    attention  q_proj h -> Hq a, k_proj and v_proj h -> Hkv a, o_proj Hq a -> h
    MLP        up_proj h -> F, down_proj F -> h
plus ``lm_head`` h -> vocab (always BF16 in the paper's recipes).

Attention's batched matmuls (BMMs), one batch entry per (sequence, query head); GQA shares K/V
heads but every query head still does its own products, so the count is Hq per sequence
(s = sequence length, a = head width):

    forward   S  = Q K^T      M = s  N = s  K = a
              O  = P V        M = s  N = a  K = s
    backward  dV = P^T dO     M = s  N = a  K = s
              dP = dO V^T     M = s  N = s  K = a
              dQ = dS K       M = s  N = a  K = s
              dK = dS^T Q     M = s  N = a  K = s

Causal FLOPs: we count HALF of each BMM's dense 2 M N K (only the lower triangle of the s x s
score matrix is needed), which is the convention of ``models.flops`` (Megatron's hybrid formula:
``6 x Hq a s / 2 x 2`` per token and attention layer) and so of the MFU numerator. A flash-attention
backward also recomputes S = Q K^T; that recomputation is hardware work, not model FLOPs, and is not
listed. The SSD scan of the Mamba mixers is not a GEMM list item here (chunked small matmuls inside
one kernel); ``models.flops`` counts it as ``3 x 7 d S`` per token and Mamba layer.

``training_gemms(cfg, tokens, seq_len)`` returns them in execution-independent order: blocks in
pattern order, each block's linears (Fprop, Dgrad, Wgrad each) then its BMMs, then ``lm_head``.
Invariants (tested): linear GEMM FLOPs sum to ``6 x tokens x models.flops.linear_parameters(cfg)``
and BMM FLOPs to ``tokens x flops_breakdown(cfg, seq_len)["attention"]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from models.config import ModelConfig

LINEAR_KINDS = ("fprop", "dgrad", "wgrad")
ATTENTION_KIND = "attention"

# The attention BMMs: (suffix, description, M, N, K as functions of (s, a)).
_ATTENTION_BMMS = (
    ("attn_scores", "S = Q K^T (forward)", "s", "s", "a"),
    ("attn_context", "O = P V (forward)", "s", "a", "s"),
    ("attn_grad_value", "dV = P^T dO (backward)", "s", "a", "s"),
    ("attn_grad_probs", "dP = dO V^T (backward)", "s", "s", "a"),
    ("attn_grad_query", "dQ = dS K (backward)", "s", "a", "s"),
    ("attn_grad_key", "dK = dS^T Q (backward)", "s", "a", "s"),
)


@dataclass(frozen=True)
class Gemm:
    """One GEMM C[M, N] = A[M, K] B[K, N] of a training step (``batch`` of them for attention BMMs)."""

    name: str
    """The linear's fully qualified module name ('layers.1.mixer.down_proj', 'lm_head'), or for attention
    BMMs 'layers.{i}.mixer.attn_scores' etc."""
    layer: Optional[int]
    """Block index in the pattern; None for lm_head."""
    layer_type: str
    """What the GEMM belongs to: 'mamba.in_proj', 'attention.o_proj', 'mlp.down_proj', 'lm_head',
    'attention.scores' ... (the grouping key of the report's per-layer-type summary)."""
    kind: str
    """'fprop', 'dgrad', 'wgrad' (linears) or 'attention' (BMMs)."""
    M: int
    """Rows of the output."""
    N: int
    """Columns of the output."""
    K: int
    """Reduction dim."""
    batch: int = 1
    """Independent products of this shape: 1 for linears; sequences x query heads for attention BMMs."""
    causal: bool = False
    """Attention BMM over a causal s x s score matrix: counted at half of its dense FLOPs."""
    quantizable: bool = False
    """A linear inside a block: a precision recipe may run it in low precision (lm_head and attention
    BMMs stay BF16)."""
    operation: str = ""
    """The product in symbols, e.g. 'Y = X W^T' or 'S = Q K^T (forward)'."""

    @property
    def flops(self) -> float:
        """2 M N K per product, times batch, halved for causal attention (the models.flops convention)."""
        dense = 2.0 * self.M * self.N * self.K * self.batch
        return dense / 2 if self.causal else dense

    @property
    def shape(self) -> Tuple[int, int, int]:
        return (self.M, self.N, self.K)


def block_linears(cfg: ModelConfig, symbol: str) -> List[Tuple[str, str, int, int]]:
    """(module name under the block's mixer, layer type, in_features, out_features) of one block."""
    h = cfg.hidden_size
    if symbol == "M":
        d = cfg.mamba_num_heads * cfg.mamba_head_dim
        in_proj_width = 2 * d + 2 * cfg.mamba_num_groups * cfg.ssm_state_size + cfg.mamba_num_heads
        return [("in_proj", "mamba.in_proj", h, in_proj_width), ("out_proj", "mamba.out_proj", d, h)]
    if symbol == "*":
        q_width = cfg.num_attention_heads * cfg.attention_head_dim
        kv_width = cfg.num_key_value_heads * cfg.attention_head_dim
        return [
            ("q_proj", "attention.q_proj", h, q_width),
            ("k_proj", "attention.k_proj", h, kv_width),
            ("v_proj", "attention.v_proj", h, kv_width),
            ("o_proj", "attention.o_proj", q_width, h),
        ]
    if symbol == "-":
        return [("up_proj", "mlp.up_proj", h, cfg.ffn_hidden_size), ("down_proj", "mlp.down_proj", cfg.ffn_hidden_size, h)]
    raise ValueError(f"ModelConfig.pattern: unknown symbol {symbol!r} (valid: 'M', '*', '-')")


def linear_gemms(
    name: str, layer: Optional[int], layer_type: str, in_features: int, out_features: int, tokens: int,
    quantizable: bool,
) -> List[Gemm]:
    """Fprop, Dgrad and Wgrad of one linear layer over ``tokens`` tokens."""
    common = dict(name=name, layer=layer, layer_type=layer_type, quantizable=quantizable)
    return [
        Gemm(kind="fprop", M=tokens, N=out_features, K=in_features, operation="Y = X W^T", **common),
        Gemm(kind="dgrad", M=tokens, N=in_features, K=out_features, operation="dX = dY W", **common),
        Gemm(kind="wgrad", M=out_features, N=in_features, K=tokens, operation="dW = dY^T X", **common),
    ]


def attention_gemms(cfg: ModelConfig, layer: int, tokens: int, seq_len: int) -> List[Gemm]:
    """The six causal BMMs of one attention block (forward and backward), BF16 in every recipe."""
    sequences = tokens // seq_len
    dims = {"s": seq_len, "a": cfg.attention_head_dim}
    return [
        Gemm(
            name=f"layers.{layer}.mixer.{suffix}",
            layer=layer,
            layer_type=f"attention.{suffix[len('attn_'):]}",
            kind=ATTENTION_KIND,
            M=dims[m],
            N=dims[n],
            K=dims[k],
            batch=sequences * cfg.num_attention_heads,
            causal=True,
            quantizable=False,
            operation=description,
        )
        for suffix, description, m, n, k in _ATTENTION_BMMS
    ]


def training_gemms(cfg: ModelConfig, tokens: int, seq_len: Optional[int] = None) -> List[Gemm]:
    """Every GEMM of one forward + backward over ``tokens`` tokens (one micro-batch).

    ``seq_len``: length of each sequence (attention is per sequence); default ``tokens`` (one
    sequence per micro-batch). ``tokens`` must be a multiple of ``seq_len``.
    """
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0:
        raise ValueError(f"training_gemms: tokens must be a positive integer, got {tokens!r}")
    seq_len = tokens if seq_len is None else seq_len
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0:
        raise ValueError(f"training_gemms: seq_len must be a positive integer, got {seq_len!r}")
    if tokens % seq_len != 0:
        raise ValueError(
            f"training_gemms: tokens ({tokens}) must be a multiple of seq_len ({seq_len}): a micro-batch "
            f"holds whole sequences"
        )
    gemms: List[Gemm] = []
    for index, symbol in enumerate(cfg.pattern):
        for module, layer_type, in_features, out_features in block_linears(cfg, symbol):
            gemms += linear_gemms(
                f"layers.{index}.mixer.{module}", index, layer_type, in_features, out_features, tokens,
                quantizable=True,
            )
        if symbol == "*":
            gemms += attention_gemms(cfg, index, tokens, seq_len)
    gemms += linear_gemms("lm_head", None, "lm_head", cfg.hidden_size, cfg.vocab_size, tokens, quantizable=False)
    return gemms
