"""Parameter counts (vs built models and the released models) and Megatron's hybrid FLOPs formula."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from model_testing import tiny_config
from models import build_model
from models.config import load_model_config
from models.flops import count_parameters, flops_breakdown, flops_per_token, linear_parameters


@pytest.mark.parametrize("name", ["tiny", "quickstart", "slice_12b", "hybrid_12b", "hybrid_8b"])
def test_count_matches_built_model(name):
    cfg = load_model_config(name)
    with torch.device("meta"):
        model = build_model(cfg)
    assert count_parameters(cfg) == sum(p.numel() for p in model.parameters())
    gemm_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    assert linear_parameters(cfg) == gemm_weights


def test_count_matches_built_model_odd_dims():
    cfg = tiny_config(pattern="*M--M", conv_kernel=3, mamba_num_groups=4, num_key_value_heads=1, attention_head_dim=24)
    assert count_parameters(cfg) == sum(p.numel() for p in build_model(cfg).parameters())


def test_released_parameter_counts():
    # Nemotron-Nano-12B-v2(-Base) model card: 12.31B; Nemotron-H-8B-Base-8K: 8B (8.1B);
    # the 12B-shaped slice (configs/model/slice_12b.yaml) has 2.54B.
    assert count_parameters(load_model_config("hybrid_12b")) == 12_310_001_152
    assert round(count_parameters(load_model_config("hybrid_12b")) / 1e9, 2) == 12.31
    assert round(count_parameters(load_model_config("hybrid_8b")) / 1e9, 2) == 8.10
    assert round(count_parameters(load_model_config("slice_12b")) / 1e9, 2) == 2.54


def megatron_hybrid_flops(batch, seq, hidden, n_attn, n_mamba, n_mlp, state, groups, heads, n_q, n_kv, kv_ch, ffn, vocab):
    """Megatron-LM's ``hybrid_flops`` (megatron/training/training.py), transcribed term by term."""
    p = kv_ch * n_q / hidden
    attn = 4 * batch * seq * hidden * p * (hidden + hidden * (n_kv / n_q) + seq / 2)
    mlp = 4 * (ffn / hidden) * batch * seq * hidden**2
    d_in = 2 * hidden
    mamba = (
        2 * batch * seq * hidden * (2 * d_in + 2 * groups * state + heads)
        + 7 * batch * seq * d_in * state
        + 2 * batch * seq * d_in * hidden
    )
    logits = 2 * batch * seq * hidden * vocab
    return 3 * (n_attn * attn + n_mlp * mlp + n_mamba * mamba + logits)


@pytest.mark.parametrize("name", ["slice_12b", "hybrid_12b", "hybrid_8b"])
@pytest.mark.parametrize("seq", [4096, 8192])
def test_flops_match_megatron_formula(name, seq):
    cfg = load_model_config(name)
    expected = megatron_hybrid_flops(
        1, seq, cfg.hidden_size, cfg.pattern.count("*"), cfg.pattern.count("M"), cfg.pattern.count("-"),
        cfg.ssm_state_size, cfg.mamba_num_groups, cfg.mamba_num_heads, cfg.num_attention_heads,
        cfg.num_key_value_heads, cfg.attention_head_dim, cfg.ffn_hidden_size, cfg.vocab_size,
    )
    assert flops_per_token(cfg, seq) * seq == pytest.approx(expected, rel=1e-12)


def test_slice_flops_per_step():
    """Megatron-Core's slice time is quoted with 93.9 TFLOP per 8192-token step; Megatron's formula with its
    scan term gives 94.58, and 93.90 without it (the scan term is 0.68 TFLOP)."""
    cfg = load_model_config("slice_12b")
    terms = {k: v * 8192 / 1e12 for k, v in flops_breakdown(cfg, 8192).items()}
    assert sum(terms.values()) == pytest.approx(94.575, abs=0.01)
    assert terms["linear"] + terms["attention"] == pytest.approx(93.9, abs=0.01)
    assert terms["ssd_scan"] == pytest.approx(0.676, abs=0.001)
    # 6 x linear params dominates; attention scales with the sequence.
    assert terms["linear"] == pytest.approx(6 * 8192 * linear_parameters(cfg) / 1e12)
    assert flops_breakdown(cfg, 4096)["attention"] == pytest.approx(flops_breakdown(cfg, 8192)["attention"] / 2)
    with pytest.raises(ValueError, match="seq_len"):
        flops_per_token(cfg, 0)
