"""Ctrl-C and a stop signal in a step that also saves: one checkpoint per step, never a committed
checkpoint deleted, a second SIGINT stops at once, and the restart resumes from the newest
committed step. SIGHUP and SIGQUIT stop as SIGTERM does, alone and through torchrun; a torchrun that dies
(SIGUSR1, SIGKILL) leaves no worker training on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from trainer_testing import FAULT_ENTRY, ROOT, read_jsonl, run_cli, tiny_overrides


def _names(run_dir):
    return sorted(path.name for path in (run_dir / "checkpoints").iterdir() if path.name != "trainer.lock")


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



@pytest.mark.parametrize("name", ["SIGHUP", "SIGQUIT"])
def test_sighup_and_sigquit_save_at_the_step_boundary_like_sigterm(tmp_path, data_cache, name):
    """A closed terminal (SIGHUP) or Ctrl-\\ (SIGQUIT) during step 2 of a run that saves only at its end: a
    checkpoint of step 2, exit 0 with a message, and the next start resumes from it."""
    run_dir = tmp_path / "run"
    args = tiny_overrides(data_cache, steps=4)  # checkpoint.every=0: nothing else would save before step 4
    first = run_cli([f"--signal-at-step=2:{name}", *args], run_dir, module=FAULT_ENTRY)
    assert first.returncode == 0, (first.returncode, first.stderr[-3000:])
    assert f"{name}: saving a checkpoint at the end of this step, then stopping" in first.stderr
    assert "Traceback" not in first.stderr and "preempted at step 2" in first.stdout
    events = read_jsonl(run_dir / "events.jsonl")
    assert [(e["step"], e["signal"]) for e in events if e["event"] == "preempted"] == [(2, name)]
    assert _names(run_dir) == ["step_00000002"]
    if name == "SIGHUP":
        again = run_cli(args, run_dir)
        assert again.returncode == 0, again.stderr[-3000:]
        assert [e["step"] for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "resumed"] == [2]
        assert [step for step, _ in _metrics(run_dir)] == [1, 2, 3, 4]


@pytest.mark.distributed
@pytest.mark.parametrize("name, seen", [("SIGHUP", "SIGHUP"), ("SIGQUIT", "SIGQUIT"), ("SIGUSR1", "SIGTERM"),
                                        ("SIGKILL", "SIGTERM")])
def test_signals_to_torchrun_stop_every_worker_with_a_checkpoint(tmp_path, data_cache, name, seen):
    """torchrun's agent (torch 2.13) passes SIGHUP and SIGQUIT on to its workers as the same signal (then SIGKILL
    after its shutdown timeout); SIGUSR1, which it does not pass on by default, and SIGKILL end the agent itself,
    and each orphaned worker then gets SIGTERM from the kernel. Either way both ranks stop at one step boundary
    with a checkpoint of that step."""
    from trainer.checkpoint.integrity import verify_directory

    run_dir = tmp_path / "run"
    args = tiny_overrides(data_cache, steps=10_000) + [f"run_dir={run_dir}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    agent = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                              "-m", "trainer", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    metrics, deadline = run_dir / "metrics.jsonl", time.time() + 240
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        assert agent.poll() is None, agent.communicate()[0][-3000:]
        time.sleep(0.2)
    agent.send_signal(getattr(signal, name))  # to the agent only, as a closed terminal or a scheduler reaches it
    output = agent.communicate(timeout=180)[0]  # until every worker has closed the agent's output too
    preempted = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "preempted"]
    assert len(preempted) == 1 and preempted[0]["signal"] == seen, output[-3000:]
    step = preempted[0]["step"]
    assert _names(run_dir)[-1] == f"step_{step:08d}"
    checkpoint = run_dir / "checkpoints" / f"step_{step:08d}"
    assert verify_directory(checkpoint, hash_files=True) == []
    assert json.loads((checkpoint / "trainer_state.json").read_text())["world_size"] == 2
    if name == seen:
        assert f"{name}: saving a checkpoint at the end of this step" in output


def test_a_terminal_that_closes_under_the_trainer_stops_it_with_a_checkpoint(tmp_path, data_cache):
    """The trainer runs on a terminal (a pseudo-terminal it controls, as an ssh session's shell gives it) that
    closes: the kernel sends SIGHUP and every later write to the terminal fails (EIO). The trainer saves at the
    step boundary and exits 0; the prints of the save go nowhere instead of failing it."""
    import fcntl
    import select
    import termios

    run_dir = tmp_path / "run"
    args = tiny_overrides(data_cache, steps=10_000) + [f"run_dir={run_dir}"]
    master, terminal = os.openpty()

    def control_the_terminal():  # in the child: a new session whose controlling terminal is the pty
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    process = subprocess.Popen([sys.executable, "-m", "trainer", *args], cwd=ROOT, stdin=terminal, stdout=terminal,
                               stderr=terminal, start_new_session=True, preexec_fn=control_the_terminal,
                               env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))
    os.close(terminal)
    shown = []

    def show(seconds: float):  # what a terminal emulator does: read what the trainer prints
        ready, _, _ = select.select([master], [], [], seconds)
        if ready:
            try:
                shown.append(os.read(master, 65536))
            except OSError:
                pass

    try:
        metrics, deadline = run_dir / "metrics.jsonl", time.time() + 240
        while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 4):
            assert process.poll() is None, b"".join(shown)[-3000:]
            show(0.2)
    except BaseException:
        process.kill()
        raise
    os.close(master)  # the terminal closes: SIGHUP, then EIO on every write
    try:
        assert process.wait(timeout=180) == 0, b"".join(shown)[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
    preempted = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "preempted"]
    assert [e["signal"] for e in preempted] == ["SIGHUP"]
    step = preempted[0]["step"]
    assert _names(run_dir) == [f"step_{step:08d}"] and step >= 4
