"""The 12B config written out from the released Nemotron-Nano-12B-v2 config.json (docs/model.md),
independent of configs/model/ (the tests of models.gemms, MFU and the GEMM report compare the
committed config and their numbers with it)."""

from __future__ import annotations

from models.config import ModelConfig

PATTERN_12B = "M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-"


def config_12b() -> ModelConfig:
    """Nemotron-Nano-12B-v2's dims, written out from its released config.json (independent of configs/model/)."""
    return ModelConfig(
        name="hybrid_12b", pattern=PATTERN_12B, vocab_size=131072, hidden_size=5120, ffn_hidden_size=20480,
        num_attention_heads=40, num_key_value_heads=8, attention_head_dim=128, mamba_num_heads=128,
        mamba_head_dim=80, ssm_state_size=128, mamba_num_groups=8,
    ).validate()
