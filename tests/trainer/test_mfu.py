"""MFU (trainer.metrics.mfu over models.flops.flops_per_token) against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from models.config import load_model_config
from models.flops import flops_per_token
from models.gemms import training_gemms
from trainer.hardware import GPUS, bf16_peak_flops, detect_gpu
from trainer.metrics import mfu
from model_12b import config_12b


def test_mfu_of_the_tiny_config_by_hand():
    """tiny: pattern 'M-M*M-' (3 Mamba, 1 attention, 2 MLP), hidden 64, ffn 128, 4 q / 2 kv heads of 16,
    Mamba 16 heads x 8 (d = 128), state 16, 2 groups, vocab 256; sequence 128."""
    cfg = load_model_config("tiny")
    assert (cfg.pattern, cfg.hidden_size, cfg.vocab_size) == ("M-M*M-", 64, 256)
    mamba = 64 * (2 * 128 + 2 * 2 * 16 + 16) + 128 * 64  # in_proj 21504 + out_proj 8192
    attention = 64 * 64 + 64 * 32 + 64 * 32 + 64 * 64  # q, k, v, o
    mlp = 2 * 64 * 128
    lm_head = 256 * 64
    linear = 3 * mamba + attention + 2 * mlp + lm_head
    assert linear == 150_528
    seq = 128
    attention_flops = 3 * 2 * 2 * 4 * 16 * seq / 2  # fwd+bwd x (QK^T, PV) x 2 FLOP/MAC x Hq a x s/2 (causal)
    scan_flops = 3 * 3 * 7 * 128 * 16  # fwd+bwd x Mamba layers x Megatron's 7 d N
    per_token = 6 * linear + attention_flops + scan_flops
    assert per_token == 1_081_344
    assert flops_per_token(cfg, seq) == per_token

    tokens_per_s_per_gpu = 2.5e8
    h200_bf16_peak = 989.4e12  # H200 SXM dense BF16 (datasheet)
    assert GPUS["H200"].peak_flops["bf16"] == h200_bf16_peak
    assert mfu(tokens_per_s_per_gpu, flops_per_token(cfg, seq), h200_bf16_peak) == pytest.approx(
        2.5e8 * 1_081_344 / 989.4e12, rel=1e-12)
    assert mfu(tokens_per_s_per_gpu, per_token, None) is None  # unknown GPU or CPU: no MFU


def test_mfu_of_the_12b_from_its_gemm_list():
    """An independent sum: every GEMM of a step (models.gemms) plus the SSD scan term, per token."""
    cfg = config_12b()
    tokens = seq = 8192
    gemm_flops = sum(g.flops for g in training_gemms(cfg, tokens, seq))
    scan = 3 * 28 * 7 * (128 * 80) * 128 * tokens
    per_token = (gemm_flops + scan) / tokens
    assert flops_per_token(cfg, seq) == pytest.approx(per_token, rel=1e-12)
    assert per_token == pytest.approx(72.1e9, rel=1e-3)  # 590.64 TFLOP per 8192-token step
    # 8 B200s at 1,000 tokens/s each: 72.1 TFLOP/s of 2,250 dense BF16.
    assert mfu(1000.0, flops_per_token(cfg, seq), GPUS["B200"].peak_flops["bf16"]) == pytest.approx(
        1000.0 * per_token / 2250e12, rel=1e-12)


def test_peak_lookup_matches_the_present_device():
    if torch.cuda.is_available():
        spec = detect_gpu()
        assert bf16_peak_flops() == (spec.peak_flops["bf16"] if spec else None)
    else:
        assert detect_gpu() is None and bf16_peak_flops() is None
