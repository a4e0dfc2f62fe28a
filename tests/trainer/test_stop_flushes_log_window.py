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


def test_a_resume_from_an_older_checkpoint_moves_the_later_history_aside(tmp_path, data_cache):
    """A finished run resumed again from its last checkpoint (step 7; none at the end) retrains steps 8-10:
    metrics.jsonl keeps one history (the new line 10), and the old line 10 is moved, not lost."""
    overrides = tiny_overrides(data_cache, steps=10) + ["logging.log_every=5", "checkpoint.save_at_end=false"]
    first = train(compose_train_config(overrides, tmp_path), callbacks=[SigtermAfterStep(7)])
    finished = train(compose_train_config(overrides, tmp_path))
    old_line = read_jsonl(tmp_path / "metrics.jsonl")[-1]
    assert finished["status"] == "completed" and old_line["step"] == 10

    again = train(compose_train_config(overrides, tmp_path))  # resumes from step 7 once more
    assert again["status"] == "completed" and len(again["losses"]) == 3
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    assert [line["step"] for line in lines] == [5, 7, 10]  # one history: no step twice
    assert lines[-1]["loss"] == pytest.approx(_mean(first["losses"][5:7] + again["losses"]))  # steps 6-10
    moved = read_jsonl(tmp_path / "metrics.superseded.jsonl")
    assert moved[0]["superseded_at_start_step"] == 7 and moved[1:] == [old_line]
    events = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["event"] == "metrics_superseded"]
    assert len(events) == 1 and events[0]["step"] == 7 and events[0]["lines"] == 1 and events[0]["last_step"] == 10


def test_superseded_lines_include_a_line_cut_off_by_a_crash(tmp_path):
    from trainer.metrics import SUPERSEDED_METRICS, move_superseded_lines

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 5, "loss": 2.0}\n{"step": 7, "loss": 1.5, "partial": true}\n'
                    '{"step": 10, "loss": 1.2}\n{"step": 15, "lo')
    moved = move_superseded_lines(path, 7)
    assert moved["lines"] == 2 and (moved["first_step"], moved["last_step"]) == (10, 10)
    assert path.read_text() == '{"step": 5, "loss": 2.0}\n{"step": 7, "loss": 1.5, "partial": true}\n'
    assert (tmp_path / SUPERSEDED_METRICS).read_text().splitlines()[1:] == ['{"step": 10, "loss": 1.2}', '{"step": 15, "lo']
    assert move_superseded_lines(path, 7) == {}  # nothing past step 7 any more: the file is left alone
