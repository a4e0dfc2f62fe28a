"""The planner (`python -m trainer.plan_run`) and the trainer (python -m trainer) refuse the same inputs with the same
message and exit status 2: both run the one start-up stage (trainer/startup.py) and print its refusals with
trainer/__main__.py's wording. The inputs: docs/reliability.md's config rows and the parallel layout's."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys

import pytest

from test_config_validation import BAD_VALUES
from trainer.__main__ import user_error_message
from trainer.startup import start_run
from trainer.validate import ConfigError
from trainer_testing import ROOT, compose_train_config, tiny_overrides

LAYOUT_VALUES = ["parallel.tp=3", "parallel.tp=0", "parallel.reshard=always", "parallel.grad_reduce=never",
                 "train.batch_policy=closest", "train.batch_tolerance=1.5", "optim.lr=nan",
                 # context parallelism: a sequence it cannot split, a piece shorter than the Mamba conv's halo
                 "parallel.cp=0", "parallel.cp=3", "parallel.cp=32"]


# Pairs: gathering NVFP4 weights as codes has no late switch to BF16.
LAYOUT_PAIRS = [("parallel.gather_nvfp4_weights=true", "precision.switch_to_bf16_at_step=5"),
                ("parallel.gather_nvfp4_weights=true", "precision.switch_to_bf16_at_tokens=1000")]


def _plan_run():
    import trainer.plan_run

    return trainer.plan_run


def _planner(overrides: list, *options: str) -> tuple:
    """(exit status, stderr) of trainer.plan_run's main, in this process."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = _plan_run().main([*overrides, "--gpu", "CPU", *options])
    return status, err.getvalue().strip()


def _trainer(overrides: list, run_dir) -> str:
    """What the trainer prints when its start-up stage refuses ``overrides`` (the message of its ConfigError)."""
    with pytest.raises(ConfigError) as refused:
        start_run(compose_train_config(overrides, run_dir))
    return user_error_message(refused.value)


def _launched_as_rank_0_of(world: int, monkeypatch) -> None:
    """The environment torchrun gives rank 0 of ``world`` processes on one node."""
    for name, value in (("WORLD_SIZE", world), ("LOCAL_WORLD_SIZE", world), ("RANK", 0), ("LOCAL_RANK", 0)):
        monkeypatch.setenv(name, str(value))


@pytest.mark.parametrize("override", [o for o, _ in BAD_VALUES] + LAYOUT_VALUES)
def test_the_same_value_is_refused_with_the_same_message(tmp_path, data_cache, override):
    overrides = [o for o in tiny_overrides(data_cache) if not o.startswith("train.micro_batch_size")]
    overrides += ["train.micro_batch_size=4", override]
    expected = _trainer(overrides, tmp_path)
    assert _planner(overrides) == (2, expected)


def test_a_batch_the_world_cannot_run_is_refused_alike(tmp_path, monkeypatch, data_cache):
    overrides = tiny_overrides(data_cache) + ["train.micro_batch_size=2", "train.global_batch_size=8",
                                              "parallel.fsdp=on", "train.batch_policy=exact"]
    _launched_as_rank_0_of(3, monkeypatch)
    expected = _trainer(overrides, tmp_path)
    assert "train.batch_policy=exact" in expected
    assert _planner(overrides, "--gpus", "3", "--gpus-per-node", "3") == (2, expected)


def test_a_quantized_lm_head_tp_cannot_split_is_refused_alike(tmp_path, monkeypatch, data_cache):
    """Under tp the LM head is column-parallel over the vocabulary: 528 / 2 = 264 rows cut NVFP4's 16-blocks."""
    overrides = tiny_overrides(data_cache) + ["model.vocab_size=528", "model.mamba_num_heads=32",
                                              "model.mamba_head_dim=4", "precision.quantize_lm_head=true",
                                              "parallel.tp=2", "train.global_batch_size=2"]
    _launched_as_rank_0_of(2, monkeypatch)
    expected = _trainer(overrides, tmp_path)
    assert "'lm_head' splits out_features 528 into 2 shards of 264" in expected
    assert _planner(overrides, "--gpus", "2", "--gpus-per-node", "2") == (2, expected)


@pytest.mark.parametrize("overrides", [
    ["+train.micro_btach_size=2"],  # a misspelt key: the trainer's check before Hydra's composition
    ["model=nope"],  # a config that does not compose
    ["optim.lr=-1e-3", "train.steps=0"],  # two bad fields: the first checked is named
    ["parallel.tp=3"],
])
def test_the_command_lines_print_the_same_refusal(overrides):
    """The two programs as users run them: exit status 2 and the same stderr."""
    common = ["+experiment=quickstart", *overrides]
    trainer = subprocess.run([sys.executable, "-m", "trainer", *common], cwd=ROOT, capture_output=True, text=True,
                             timeout=300)
    planner = subprocess.run([sys.executable, "-m", "trainer.plan_run", *common, "--gpu", "CPU"], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
    assert (trainer.returncode, planner.returncode) == (2, 2), (trainer.stderr[-2000:], planner.stderr[-2000:])
    assert trainer.stderr.strip() and trainer.stderr.strip() == planner.stderr.strip()


@pytest.mark.parametrize("pair", LAYOUT_PAIRS)
def test_the_same_combination_is_refused_with_the_same_message(tmp_path, data_cache, pair):
    overrides = [o for o in tiny_overrides(data_cache) if not o.startswith("train.micro_batch_size")]
    overrides += ["train.micro_batch_size=4", *pair]
    expected = _trainer(overrides, tmp_path)
    assert "parallel.gather_nvfp4_weights" in expected
    assert _planner(overrides) == (2, expected)
