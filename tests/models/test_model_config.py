"""ModelConfig validation and the named yaml configs."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn
import yaml

from models import build_model
from models.config import CONFIG_DIR, MODEL_CONFIG_FIELDS, ModelConfig, load_model_config
from model_testing import tiny_config

NAMED = ["tiny", "quickstart", "slice_12b", "hybrid_12b", "hybrid_8b"]


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"pattern": ""}, "pattern"),
        ({"pattern": "M-X*"}, "pattern"),
        ({"pattern": "M-m"}, "pattern"),
        ({"num_attention_heads": 6, "num_key_value_heads": 4}, "num_key_value_heads"),
        ({"mamba_num_heads": 16, "mamba_num_groups": 3}, "mamba_num_groups"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"mamba_head_dim": -8}, "mamba_head_dim"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"norm_eps": 0.0}, "norm_eps"),
        ({"time_step_min": 0.2, "time_step_max": 0.1}, "time_step_max"),
        ({"A_init_min": 8.0, "A_init_max": 2.0}, "A_init_max"),
        ({"time_step_clamp_min": -1.0}, "time_step_clamp_min"),
        ({"ssd_backend": "cuda"}, "ssd_backend"),
        ({"gated_norm_backend": "fast"}, "gated_norm_backend"),
        ({"conv_backend": "cudnn"}, "conv_backend"),
    ],
)
def test_bad_config_fails_at_build_naming_the_field(overrides, field):
    cfg = tiny_config(**overrides)
    with pytest.raises(ValueError, match=field):
        build_model(cfg)


def test_unknown_symbol_error_names_symbol_and_position():
    with pytest.raises(ValueError, match=r"'X' at position 2"):
        tiny_config(pattern="M-X").validate()


@pytest.mark.parametrize("name", NAMED)
def test_named_configs_load_validate_and_are_plain_mappings(name):
    path = CONFIG_DIR / f"{name}.yaml"
    raw = yaml.safe_load(path.read_text())
    assert isinstance(raw, dict) and "defaults" not in raw
    assert set(raw) <= set(MODEL_CONFIG_FIELDS), set(raw) - set(MODEL_CONFIG_FIELDS)
    cfg = load_model_config(name)
    assert cfg.name == name == path.stem
    assert set(cfg.pattern) == {"M", "*", "-"}


@pytest.mark.parametrize("name", ["tiny", "quickstart", "slice_12b", "hybrid_12b", "hybrid_8b"])
def test_every_linear_dim_divides_16(name):
    """NVFP4 needs 16-divisible GEMM dims; all our configs keep every linear eligible."""
    cfg = load_model_config(name)
    with torch.device("meta"):
        model = build_model(cfg)

    for module_name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            assert module.in_features % 16 == 0 and module.out_features % 16 == 0, module_name


def test_quickstart_dims_as_specified():
    cfg = load_model_config("quickstart")
    assert (cfg.pattern, cfg.hidden_size, cfg.ffn_hidden_size, cfg.vocab_size) == ("M-M*M-", 256, 1024, 4096)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.attention_head_dim) == (4, 2, 64)
    assert (cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.ssm_state_size, cfg.mamba_num_groups) == (16, 32, 32, 2)
    assert cfg.chunk_size == 64
    # The dataclass defaults are the quickstart model.
    assert dataclasses.asdict(ModelConfig()) == dataclasses.asdict(cfg)


def test_released_dims():
    c12 = load_model_config("hybrid_12b")
    assert (c12.num_blocks, c12.hidden_size, c12.ffn_hidden_size) == (62, 5120, 20480)
    assert (c12.pattern.count("M"), c12.pattern.count("*"), c12.pattern.count("-")) == (28, 6, 28)
    assert (c12.mamba_num_heads, c12.mamba_head_dim, c12.ssm_state_size, c12.mamba_num_groups) == (128, 80, 128, 8)
    c8 = load_model_config("hybrid_8b")
    assert (c8.num_blocks, c8.hidden_size, c8.ffn_hidden_size) == (52, 4096, 21504)
    assert (c8.pattern.count("M"), c8.pattern.count("*"), c8.pattern.count("-")) == (24, 4, 24)
    assert (c8.mamba_num_heads, c8.mamba_head_dim) == (128, 64)


def test_override_typo_is_refused():
    with pytest.raises(Exception, match="hiden_size"):
        load_model_config("tiny", hiden_size=32)
    with pytest.raises(FileNotFoundError, match="tiny"):
        load_model_config("no_such_model")
