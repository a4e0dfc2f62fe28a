"""A stop between log steps (preemption, NaN halt) writes the steps since the last metrics line, so no
step's loss goes unlogged; the window is checkpointed, so the first line after the resume averages the
same steps as an uninterrupted run's line (no seam in the log).
Faults come from outside the product code: a signal to the process, a poisoned gradient."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from trainer_testing import ROOT, compose_train_config, read_jsonl, tiny_overrides

from reports.compare_runs import keep_last_per_step
from trainer.guards import NonFiniteHalt
from trainer.loop import Callback, train


class SigtermAfterStep(Callback):
    """Preemption: SIGTERM to this process once step `step` is done (the loop stops at that boundary)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, ctx, metrics):
        if ctx.state.step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class PoisonAt(Callback):
    def __init__(self, step: int):
        self.step = step

    def on_after_backward(self, ctx):
        if ctx.state.step == self.step:
            next(p for p in ctx.model.parameters() if p.grad is not None).grad.fill_(float("nan"))


def _mean(values):
    return sum(values) / len(values)


def test_preemption_flushes_the_partial_window_and_the_resume_continues_it(tmp_path, data_cache):
    overrides = tiny_overrides(data_cache, steps=10) + ["logging.log_every=5"]
    first = train(compose_train_config(overrides, tmp_path), callbacks=[SigtermAfterStep(7)])
    assert first["status"] == "preempted" and first["step"] == 7
    second = train(compose_train_config(overrides, tmp_path))  # resumes from the checkpoint of step 7
    assert second["status"] == "completed" and len(second["losses"]) == 3  # steps 8, 9, 10

    lines = {line["step"]: line for line in read_jsonl(tmp_path / "metrics.jsonl")}
    assert sorted(lines) == [5, 7, 10]
    assert "window_steps" not in lines[5] and "partial" not in lines[5]  # a regular window: steps 1-5
    assert lines[5]["loss"] == pytest.approx(_mean(first["losses"][:5]))
    assert lines[7]["partial"] is True and lines[7]["window_steps"] == 2  # steps 6-7, flushed at the stop
    assert lines[7]["loss"] == pytest.approx(_mean(first["losses"][5:7]))
    assert lines[7]["tokens"] == 7 * 4 * 64
    # steps 6-10: the window of the stop, restored from the checkpoint, and steps 8-10 after the resume
    assert "partial" not in lines[10] and "window_steps" not in lines[10]
    assert lines[10]["loss"] == pytest.approx(_mean(first["losses"][5:7] + second["losses"]))

    uninterrupted = tmp_path / "uninterrupted"
    train(compose_train_config(overrides, uninterrupted))
    reference = {line["step"]: line for line in read_jsonl(uninterrupted / "metrics.jsonl")}
    assert sorted(reference) == [5, 10]
    # the same windows as the uninterrupted run (the CPU run is deterministic)
    assert lines[10]["loss"] == pytest.approx(reference[10]["loss"], rel=1e-6)
    assert [r["step"] for r in keep_last_per_step(read_jsonl(tmp_path / "metrics.jsonl"))] == [5, 10]


def test_nan_halt_flushes_the_partial_window(tmp_path, data_cache):
    overrides = tiny_overrides(data_cache, steps=10) + ["logging.log_every=5", "train.max_consecutive_skips=1"]
    with pytest.raises(NonFiniteHalt):
        train(compose_train_config(overrides, tmp_path), callbacks=[PoisonAt(6)])  # step 7 is non-finite
    lines = {line["step"]: line for line in read_jsonl(tmp_path / "metrics.jsonl")}
    assert sorted(lines) == [5, 7]
    assert lines[7]["partial"] is True and lines[7]["window_steps"] == 2
    assert lines[7]["skipped_steps"] == 1  # the loss is step 6's: the mean of the window's finite losses
    assert lines[7]["loss"] != "nan"


def test_no_product_module_reads_test_fault_variables():
    for package in ("trainer", "models", "data", "scripts"):
        for path in Path(ROOT, package).rglob("*.py"):
            assert "HYBRID_TEST" not in path.read_text(), path
