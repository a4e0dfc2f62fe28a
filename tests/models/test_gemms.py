"""models.gemms: the GEMMs of a training step from the dims, checked against hand numbers and the built model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

from models import build_model
from models.config import load_model_config
from models.flops import flops_breakdown, linear_parameters
from models.gemms import training_gemms
from model_12b import PATTERN_12B, config_12b

REPOSITORY = Path(__file__).resolve().parents[2]

TOKENS = 8192


def test_12b_config_file_matches_design():
    """The report runs on configs/model/hybrid_12b.yaml: it must carry the released model's dims."""
    if not (REPOSITORY / "configs" / "model" / "hybrid_12b.yaml").exists():
        pytest.fail("configs/model/hybrid_12b.yaml is missing")
    loaded, expected = load_model_config("hybrid_12b"), config_12b()
    for field in ("pattern", "vocab_size", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                  "num_key_value_heads", "attention_head_dim", "mamba_num_heads", "mamba_head_dim",
                  "ssm_state_size", "mamba_num_groups"):
        assert getattr(loaded, field) == getattr(expected, field), field


def test_12b_lists_every_block_with_hand_computed_shapes():
    cfg = config_12b()
    gemms = training_gemms(cfg, TOKENS)
    assert len(PATTERN_12B) == 62
    assert sorted({g.layer for g in gemms if g.layer is not None}) == list(range(62))

    in_proj_width = 2 * 10240 + 2 * 8 * 128 + 128
    assert in_proj_width == 22656
    expected_linear = {  # (in, out) per linear, hand-written from the released config's dims
        "M": {"in_proj": (5120, in_proj_width), "out_proj": (128 * 80, 5120)},
        "*": {"q_proj": (5120, 40 * 128), "k_proj": (5120, 8 * 128), "v_proj": (5120, 8 * 128), "o_proj": (40 * 128, 5120)},
        "-": {"up_proj": (5120, 20480), "down_proj": (20480, 5120)},
    }
    by_name = {}
    for g in gemms:
        by_name.setdefault(g.name, {})[g.kind] = g
    for index, symbol in enumerate(PATTERN_12B):
        for module, (fan_in, fan_out) in expected_linear[symbol].items():
            kinds = by_name.pop(f"layers.{index}.mixer.{module}")
            assert set(kinds) == {"fprop", "dgrad", "wgrad"}
            assert kinds["fprop"].shape == (TOKENS, fan_out, fan_in)
            assert kinds["dgrad"].shape == (TOKENS, fan_in, fan_out)
            assert kinds["wgrad"].shape == (fan_out, fan_in, TOKENS)
            assert all(g.quantizable and g.layer == index for g in kinds.values())
    lm_head = by_name.pop("lm_head")
    assert lm_head["fprop"].shape == (TOKENS, 131072, 5120)
    assert not any(g.quantizable for g in lm_head.values())
    # What is left: the six attention BMMs of each of the 6 attention blocks, BF16.
    attention_blocks = [i for i, s in enumerate(PATTERN_12B) if s == "*"]
    assert len(attention_blocks) == 6
    assert len(by_name) == 6 * 6
    for kinds in by_name.values():
        (bmm,) = kinds.values()
        assert bmm.kind == "attention" and not bmm.quantizable and bmm.causal
        assert bmm.layer in attention_blocks and bmm.batch == 40
        assert sorted(bmm.shape) in ([128, 8192, 8192],)
    assert len(gemms) == 3 * (28 * 2 + 6 * 4 + 28 * 2 + 1) + 36


def test_golden_row_mlp_down_fprop_of_block_1():
    cfg = config_12b()
    (row,) = [g for g in training_gemms(cfg, TOKENS) if g.name == "layers.1.mixer.down_proj" and g.kind == "fprop"]
    assert (row.M, row.N, row.K) == (8192, 5120, 20480)
    assert row.flops == 2 * 8192 * 5120 * 20480 == 1_717_986_918_400
    assert row.layer_type == "mlp.down_proj" and row.operation == "Y = X W^T"


@pytest.mark.parametrize("name", ["tiny", "quickstart", "hybrid_8b"])
def test_names_and_shapes_match_the_built_model(name):
    cfg = load_model_config(name)
    with torch.device("meta"):
        model = build_model(cfg)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    fprops = {g.name: g for g in training_gemms(cfg, 256) if g.kind == "fprop"}
    assert set(fprops) == set(linears)
    for linear_name, module in linears.items():
        assert (fprops[linear_name].N, fprops[linear_name].K) == (module.out_features, module.in_features)


@pytest.mark.parametrize("seq_len", [8192, 4096, 1024])
def test_flops_agree_with_models_flops(seq_len):
    """Linears sum to 6 x tokens x GEMM weights; the causal BMMs to the MFU formula's attention term."""
    cfg = config_12b()
    gemms = training_gemms(cfg, TOKENS, seq_len)
    linear = sum(g.flops for g in gemms if g.kind != "attention")
    attention = sum(g.flops for g in gemms if g.kind == "attention")
    assert linear == 6 * TOKENS * linear_parameters(cfg)
    assert attention == pytest.approx(TOKENS * flops_breakdown(cfg, seq_len)["attention"], rel=1e-12)
    # Hand value for one attention block and one 8192-token sequence: 6 BMMs x 40 heads x s*s*128 (half of 2 s s a).
    if seq_len == 8192:
        assert attention == 6 * 6 * 40 * 8192 * 8192 * 128


def test_bad_token_counts_fail_naming_the_argument():
    cfg = config_12b()
    with pytest.raises(ValueError, match="tokens"):
        training_gemms(cfg, 0)
    with pytest.raises(ValueError, match="multiple of seq_len"):
        training_gemms(cfg, 8192, seq_len=3000)
