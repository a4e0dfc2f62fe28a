"""Out-of-range config values stop the run at start, before data or model, naming the field."""

from __future__ import annotations

import subprocess
import sys

import pytest

import trainer.loop
from trainer.validate import ConfigError, validate_train_config
from trainer_testing import ROOT, compose_train_config, tiny_overrides

BAD_VALUES = [
    ("logging.log_every=0", "logging.log_every must be a positive integer, got 0"),
    ("train.micro_batch_size=0", "train.micro_batch_size must be a positive integer, got 0"),
    ("train.steps=-5", "train.steps must be a positive integer, got -5"),
    ("checkpoint.every=-1", "checkpoint.every must be an integer >= 0"),
    ("checkpoint.keep=-2", "checkpoint.keep must be an integer >= 0"),
    ("optim.lr=-1e-3", "optim.lr must be a finite number > 0, got -0.001"),
    ("optim.min_lr=1.0", r"optim.min_lr must be a finite number in \[0, optim.lr=0.003\]"),
    ("optim.warmup_steps=-1", "optim.warmup_steps must be an integer >= 0"),
    ("optim.beta2=1.0", r"optim.beta2 must be in \[0, 1\)"),
    ("train.global_batch_size=6", r"train.global_batch_size \(6\) must be a multiple of train.micro_batch_size \(4\)"),
    ("train.eval_every=-1", "train.eval_every must be an integer >= 0"),
    ("train.max_consecutive_skips=0", "train.max_consecutive_skips must be a positive integer"),
    ("train.skip_batches=[3,-1]", r"train.skip_batches\[1\] must be a global batch index >= 0"),
    ("checkpoint.on_corrupt=ignore", "checkpoint.on_corrupt must be 'fallback' or 'stop', got 'ignore'"),
    ("parallel.collective_timeout_s=0", "parallel.collective_timeout_s must be a finite number of seconds > 0"),
    ("model.hidden_size=0", "model.hidden_size must be a positive integer, got 0"),
    ("data.seq_len=0", "data.seq_len must be >= 1, got 0"),
    ("precision.bf16_layers_at_end=-1", "precision.bf16_layers_at_end must be >= 0"),
]


@pytest.mark.parametrize("override, message", BAD_VALUES, ids=[override for override, _ in BAD_VALUES])
def test_bad_value_stops_before_anything_is_built_naming_the_field(tmp_path, monkeypatch, override, message):
    overrides = [o for o in tiny_overrides(tmp_path) if not o.startswith("train.micro_batch_size")]
    cfg = compose_train_config(overrides + ["train.micro_batch_size=4", override], tmp_path)

    def must_not_start(*args, **kwargs):
        raise AssertionError("the run started: the config was not checked first")

    monkeypatch.setattr(trainer.loop, "init_distributed", must_not_start)
    with pytest.raises(ConfigError, match=message):
        trainer.loop.train(cfg)


def test_the_shipped_experiments_are_valid():
    from test_config import EXPERIMENTS, compose_config
    from omegaconf import OmegaConf

    for experiment in EXPERIMENTS:
        validate_train_config(OmegaConf.to_object(compose_config([f"+experiment={experiment}"])))


def test_cli_reports_the_field_without_a_traceback_into_the_model():
    result = subprocess.run([sys.executable, "-m", "trainer", "+experiment=quickstart", "optim.lr=-1e-3"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "ConfigError: optim.lr must be a finite number > 0, got -0.001" in result.stderr, result.stderr[-2000:]
    assert "build_model" not in result.stderr and "torch/optim" not in result.stderr
