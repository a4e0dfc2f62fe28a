"""`python -m trainer.export_hf`: a training checkpoint becomes a directory transformers loads, same logits."""

from __future__ import annotations


import pytest
import torch

from trainer.loop import train
from scripts_testing import run_script
from trainer.hf.export import load_checkpoint_model
from trainer_testing import compose_train_config, tiny_overrides


def test_checkpoint_exports_to_transformers_with_the_same_logits(tmp_path, data_cache):
    transformers = pytest.importorskip("transformers")
    cfg = compose_train_config(tiny_overrides(data_cache, steps=2), tmp_path / "run")
    train(cfg)
    checkpoint = tmp_path / "run" / "checkpoints" / "step_00000002"
    assert run_script("trainer.export_hf", checkpoint, tmp_path / "hf", "--dtype", "float32").returncode == 0

    ours = load_checkpoint_model(checkpoint)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    tokens = torch.randint(0, cfg.model.vocab_size, (2, 64))
    with torch.no_grad():
        expected, got = ours(tokens), theirs(tokens).logits
    assert ((got - expected).norm() / expected.norm()) < 1e-4
    # the trained weights, not the initial ones, were exported
    assert not torch.equal(ours.lm_head.weight, _initial_lm_head(cfg))


def _initial_lm_head(cfg):
    from trainer.loop import build_model_on

    return build_model_on(cfg, torch.device("cpu")).lm_head.weight.detach()


def test_export_refuses_an_incomplete_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        load_checkpoint_model(tmp_path)
