"""Ctrl-C and a stop signal in a step that also saves: one checkpoint per step, never a committed
checkpoint deleted, a second SIGINT stops at once, and the restart resumes from the newest
committed step."""

from __future__ import annotations

from trainer_testing import FAULT_ENTRY, read_jsonl, run_cli, tiny_overrides


def _names(run_dir):
    return sorted(path.name for path in (run_dir / "checkpoints").iterdir())


def _metrics(run_dir):
    return [(line["step"], line["loss"]) for line in read_jsonl(run_dir / "metrics.jsonl")]


def test_sigint_in_a_saving_step_saves_once_a_second_sigint_stops_at_once_and_the_restart_resumes(tmp_path,
                                                                                                  data_cache):
    run_dir = tmp_path / "run"
    args = tiny_overrides(data_cache, steps=4) + ["checkpoint.every=2", "checkpoint.keep=1"]

    # 1. Ctrl-C during step 2, which checkpoint.every also saves. The stop must not save step 2 a second
    #    time: that save would have to replace the committed step_2, and a kill between the two renames (this
    #    fault) would leave nothing to resume from, so the restart would begin at step 0.
    first = run_cli(["--signal-at-step=2:SIGINT", "--kill-on-second-commit=2", *args], run_dir, module=FAULT_ENTRY)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "Traceback" not in first.stderr and "KeyboardInterrupt" not in first.stderr
    assert "SIGINT: saving a checkpoint at the end of this step" in first.stderr
    assert "preempted at step 2" in first.stdout
    events = read_jsonl(run_dir / "events.jsonl")
    assert [(e["event"], e["step"]) for e in events if e["event"] in ("checkpoint", "preempted")] == [
        ("checkpoint", 2), ("preempted", 2)]
    assert [e["signal"] for e in events if e["event"] == "preempted"] == ["SIGINT"]
    assert _names(run_dir) == ["step_00000002"]

    # 2. The restart trains steps 3 and 4; two Ctrl-C while step 4 is saved: the first asks for a clean stop,
    #    the second stops at once (exit 130) without a traceback, leaving only the unfinished .tmp_ directory.
    second = run_cli(["--signals-during-save=4:SIGINT:2", *args], run_dir, module=FAULT_ENTRY)
    assert second.returncode == 130, (second.returncode, second.stderr[-3000:])
    assert "second SIGINT: stopping now" in second.stderr and "Traceback" not in second.stderr
    assert _names(run_dir) == [".tmp_step_00000004", "step_00000002"]
    interrupted = _metrics(run_dir)
    assert [step for step, _ in interrupted] == [1, 2, 3, 4]

    # 3. The next start resumes from step 2, the newest committed checkpoint, and trains steps 3 and 4 again
    #    exactly as the interrupted run did.
    third = run_cli(args, run_dir)
    assert third.returncode == 0, third.stderr[-3000:]
    resumed = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "resumed"]
    assert [e["step"] for e in resumed] == [2, 2]
    assert _metrics(run_dir) == interrupted  # one history: the retrained steps 3 and 4 equal the interrupted ones
    superseded = read_jsonl(run_dir / "metrics.superseded.jsonl")  # the interrupted lines 3 and 4, kept aside
    assert superseded[0]["superseded_at_start_step"] == 2
    assert [(line["step"], line["loss"]) for line in superseded[1:]] == interrupted[2:]
    assert _names(run_dir) == ["step_00000004"]

