"""Parameter count and training FLOPs of a hybrid model, from its dimensions alone (no build).

Parameters (h hidden, V vocab, d = H P Mamba inner width, G groups, N state, K conv width,
Hq/Hkv attention heads of width a, F ffn width):

    embeddings V h + lm_head V h + norm_f h, and per block a pre-norm h plus its mixer:
    Mamba-2   h (2d + 2GN + H)  in_proj   + (d + 2GN)(K + 1) conv1d weight+bias
              + 3H (dt_bias, A_log, D)    + d gated-norm weight      + d h out_proj
    attention h a (2 Hq + 2 Hkv)          (q, k, v, o projections)
    MLP       2 h F                       (up, down)

Training FLOPs per token: Megatron-LM's hybrid formula (``num_floating_point_operations`` ->
``hybrid_flops`` in megatron/training/training.py), forward x 3 for forward + backward:

    6 x (GEMM weights: every linear above incl. lm_head, not the embedding lookup)
  + 6 x Hq a s / 2 x 2 per attention layer   (QK^T and PV; causal, so half the s x s scores)
  + 3 x 7 d N per Mamba layer                 (Megatron's SSD scan estimate)

Megatron writes the Mamba width as d = 2 h; we use d = H P, which is the same for every
config here (Nemotron-H and Nano-v2 have H P = 2 h). Norms, conv1d, activations and the
softmax are not counted (Megatron does not count them either). For the 12B-shaped slice
(pattern ``M-M-M*-``, 12B widths, vocab 131072, 8192 tokens) this gives 94.58 TFLOP per
8192-token step; 93.90 of it are GEMMs and attention, 0.68 the scan term.
"""

from __future__ import annotations

from models.config import ModelConfig


def _counts(cfg: ModelConfig) -> tuple[int, int, int]:
    return cfg.pattern.count("M"), cfg.pattern.count("*"), cfg.pattern.count("-")


def mamba_linear_parameters(cfg: ModelConfig) -> int:
    """in_proj + out_proj weights of one Mamba-2 mixer."""
    d, gn = cfg.mamba_inner_size, cfg.mamba_num_groups * cfg.ssm_state_size
    return cfg.hidden_size * (2 * d + 2 * gn + cfg.mamba_num_heads) + d * cfg.hidden_size


def attention_linear_parameters(cfg: ModelConfig) -> int:
    """q, k, v, o projection weights of one attention block."""
    a = cfg.attention_head_dim
    return cfg.hidden_size * a * (2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads)


def mlp_linear_parameters(cfg: ModelConfig) -> int:
    """up and down projection weights of one MLP block."""
    return 2 * cfg.hidden_size * cfg.ffn_hidden_size


def linear_parameters(cfg: ModelConfig) -> int:
    """Parameters in GEMM weights: every block's linears plus the LM head (not the embedding)."""
    mamba, attention, mlp = _counts(cfg)
    return (
        mamba * mamba_linear_parameters(cfg)
        + attention * attention_linear_parameters(cfg)
        + mlp * mlp_linear_parameters(cfg)
        + cfg.vocab_size * cfg.hidden_size
    )


def count_parameters(cfg: ModelConfig) -> int:
    """Total parameter count of ``HybridLM(cfg)`` computed from the dimensions."""
    mamba, attention, mlp = _counts(cfg)
    d, gn, heads = cfg.mamba_inner_size, cfg.mamba_num_groups * cfg.ssm_state_size, cfg.mamba_num_heads
    conv_dim = d + 2 * gn
    mamba_other = conv_dim * (cfg.conv_kernel + 1) + 3 * heads + d  # conv1d, dt_bias/A_log/D, gated norm
    block_norms = cfg.num_blocks * cfg.hidden_size
    embedding_and_final_norm = cfg.vocab_size * cfg.hidden_size + cfg.hidden_size
    return linear_parameters(cfg) + mamba * mamba_other + block_norms + embedding_and_final_norm


def flops_breakdown(cfg: ModelConfig, seq_len: int) -> dict[str, float]:
    """Training (forward + backward) FLOPs per token by term, Megatron's hybrid convention."""
    if seq_len <= 0:
        raise ValueError(f"flops_breakdown: seq_len must be positive, got {seq_len}")
    mamba, attention, _ = _counts(cfg)
    return {
        "linear": 6.0 * linear_parameters(cfg),
        # QK^T and PV: 2 GEMMs x 2 FLOP/MAC x (Hq a) x s/2 keys on average (causal), x 3.
        "attention": 3.0 * attention * 2 * 2 * cfg.num_attention_heads * cfg.attention_head_dim * seq_len / 2,
        "ssd_scan": 3.0 * mamba * 7 * cfg.mamba_inner_size * cfg.ssm_state_size,
    }


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token at ``seq_len`` (the model-FLOPs numerator of MFU)."""
    return sum(flops_breakdown(cfg, seq_len).values())
