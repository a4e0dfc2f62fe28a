"""After a NaN blow-up the last good checkpoint survives any number of restarts, and both documented
recoveries work: resume from it with a lower lr, or pass over the offending batches (train.skip_batches),
exactly across resumes."""

from __future__ import annotations

import pytest

from trainer.checkpoint.layout import read_trainer_state
from trainer.guards import NonFiniteHalt
from trainer.loop import Callback, train
from trainer_testing import compose_train_config, losses_by_step, read_jsonl, tiny_overrides


class PoisonFromStep(Callback):
    """Every step from `first` on gets a NaN gradient: a blow-up that repeats after every restart."""

    def __init__(self, first: int):
        self.first = first

    def on_after_backward(self, ctx):
        if ctx.state.step >= self.first:
            next(p for p in ctx.model.parameters() if p.grad is not None).grad.fill_(float("nan"))


def _checkpoints(run_dir):
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name != "trainer.lock")


def test_nan_halt_and_restarts_never_prune_the_last_good_checkpoint_then_recover_with_lower_lr(tmp_path,
                                                                                                data_cache):
    overrides = tiny_overrides(data_cache, steps=12) + ["checkpoint.every=2", "checkpoint.keep=1",
                                                        "train.max_consecutive_skips=2"]
    with pytest.raises(NonFiniteHalt, match=r"train.skip_batches=\[4, 5\]"):
        train(compose_train_config(overrides, tmp_path), callbacks=[PoisonFromStep(4)])
    # steps 5 and 6 (indices 4, 5) were non-finite: halted with a checkpoint at 6; 4 was the last good one
    assert _checkpoints(tmp_path) == ["step_00000004", "step_00000006"]
    for restart in range(3):  # each restart: one more NaN step, another halt checkpoint, a prune
        with pytest.raises(NonFiniteHalt):
            train(compose_train_config(overrides, tmp_path), callbacks=[PoisonFromStep(4)])
        assert _checkpoints(tmp_path) == ["step_00000004", f"step_{7 + restart:08d}"]
    assert read_trainer_state(tmp_path / "checkpoints" / "step_00000004")["guard"]["skipped_in_a_row"] == 0

    # Recovery 1: resume from the good checkpoint with a lower lr (here the cause is gone too).
    good = tmp_path / "checkpoints" / "step_00000004"
    summary = train(compose_train_config(overrides + [f"checkpoint.resume={good}", "optim.lr=1e-3"], tmp_path))
    assert summary["status"] == "completed" and summary["skipped_steps"] == 0
    # the abandoned history (halt checkpoints 5-9) is set aside, so resume=auto never returns to it
    assert _checkpoints(tmp_path) == ["step_00000012", "superseded_step_00000009"]
    assert train(compose_train_config(overrides, tmp_path))["step"] == 12  # auto-resume: the new history


def test_skip_batches_pass_over_batches_and_resume_exactly(tmp_path, data_cache):
    # A constant lr schedule: a 3-step run continued to 6 steps sees the same lr as a 6-step run.
    overrides = tiny_overrides(data_cache, steps=6) + ["optim.schedule=constant", "train.skip_batches=[2,3]"]
    train(compose_train_config(overrides, tmp_path / "whole"))
    whole = read_jsonl(tmp_path / "whole" / "events.jsonl")
    assert [(e["step"], e["batch"]) for e in whole if e["event"] == "skipped_batch"] == [(2, 2), (2, 3)]
    final = read_trainer_state(tmp_path / "whole" / "checkpoints" / "step_00000006")
    assert final["skipped_batches"] == [2, 3]
    assert final["data"]["global_samples"] == (6 + 2) * 4  # 6 trained + 2 skipped global batches of 4

    # The same run in two parts; the second part no longer lists the skip: the run state carries it.
    first = [o.replace("train.steps=6", "train.steps=3") for o in overrides]
    train(compose_train_config(first, tmp_path / "parts"))
    second = [o for o in overrides if not o.startswith("train.skip_batches")]
    train(compose_train_config(second, tmp_path / "parts"))
    assert losses_by_step(tmp_path / "parts") == losses_by_step(tmp_path / "whole")
    parts_final = read_trainer_state(tmp_path / "parts" / "checkpoints" / "step_00000006")
    assert parts_final["skipped_batches"] == [2, 3]

    # And the skip changed what was learned: without it, step 3 trains on batch 2, not batch 4.
    plain = [o for o in overrides if not o.startswith("train.skip_batches")]
    train(compose_train_config(plain, tmp_path / "plain"))
    assert losses_by_step(tmp_path / "plain")[3] != losses_by_step(tmp_path / "whole")[3]
