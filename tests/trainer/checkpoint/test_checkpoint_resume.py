"""Checkpoints survive faults: kill and resume bit-identically (1 and 2 processes), reshard 2 -> 1,
kill mid-save, preemption by signal."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from fault_entry import EXIT_CODE
from trainer_testing import FAULT_ENTRY, ROOT, losses_by_step, read_jsonl, run_cli, tiny_overrides


def _checkpoints(run_dir):
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name != "trainer.lock")


def test_kill_during_save_resumes_from_previous_complete_checkpoint(tmp_path, data_cache):
    args = tiny_overrides(data_cache, steps=6) + ["checkpoint.every=2"]
    reference = run_cli(args, tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr[-3000:]

    crashed = run_cli(["--kill-during-save=4", *args], tmp_path / "run", module=FAULT_ENTRY)
    assert crashed.returncode == EXIT_CODE
    assert _checkpoints(tmp_path / "run") == [".tmp_step_00000004", "step_00000002"]

    resumed = run_cli(args, tmp_path / "run")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    assert any(e["event"] == "resumed" and e["step"] == 2 for e in events)
    # Nothing lost: the resumed run reproduces the uninterrupted losses exactly.
    assert losses_by_step(tmp_path / "run") == losses_by_step(tmp_path / "reference")
    assert ".tmp_step_00000004" not in _checkpoints(tmp_path / "run")


@pytest.mark.distributed
def test_two_process_fsdp_kill_resume_bitwise_and_reshard_to_one(tmp_path, data_cache):
    args = tiny_overrides(data_cache, steps=6) + ["checkpoint.every=2"]
    reference = run_cli(args, tmp_path / "reference", nproc=2)
    assert reference.returncode == 0, reference.stderr[-3000:]

    # The interrupted run saves asynchronously (DCP async_save on its own gloo group): a save
    # becomes visible at the first step boundary after every rank finished writing, so when the
    # kill comes after step 5 the newest complete checkpoint is step 4 or (if still in flight) 2.
    killed = run_cli(["--kill-at-step=5", *args, "checkpoint.async_save=true"], tmp_path / "run", nproc=2,
                     module=FAULT_ENTRY)
    assert killed.returncode != 0
    complete = [name for name in _checkpoints(tmp_path / "run") if name.startswith("step_")]
    assert complete[-1] in ("step_00000002", "step_00000004"), complete
    resumed = run_cli(args + ["checkpoint.async_save=true"], tmp_path / "run", nproc=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected = losses_by_step(tmp_path / "reference")
    assert losses_by_step(tmp_path / "run") == expected  # bitwise, data position included

    # The 2-process (FSDP2-sharded) checkpoint of step 4 continues on one process.
    checkpoint = tmp_path / "run" / "checkpoints" / "step_00000004"
    single = run_cli(args + [f"checkpoint.resume={checkpoint}"], tmp_path / "single", nproc=1)
    assert single.returncode == 0, single.stderr[-3000:]
    continued = losses_by_step(tmp_path / "single")
    assert sorted(continued) == [5, 6]
    for step in (5, 6):
        assert continued[step] == pytest.approx(expected[step], rel=2e-3)
    changed = [e for e in read_jsonl(tmp_path / "single" / "events.jsonl") if e["event"] == "config_changed_on_resume"]
    assert len(changed) == 1 and changed[0]["changes"]["world_size"] == [2, 1]  # an allowed change, recorded


def test_sigterm_saves_and_exits_cleanly(tmp_path, data_cache):
    run_dir = tmp_path / "run"
    args = tiny_overrides(data_cache, steps=10_000) + [f"run_dir={run_dir}"]
    process = subprocess.Popen([sys.executable, "-m", "trainer", *args], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 180
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        assert process.poll() is None, process.communicate()[1][-3000:]
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr[-3000:]
    preempted = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "preempted"]
    assert len(preempted) == 1
    step = preempted[0]["step"]
    assert (run_dir / "checkpoints" / f"step_{step:08d}" / "trainer_state.json").exists()
    assert json.loads((run_dir / "checkpoints" / f"step_{step:08d}" / "trainer_state.json").read_text())["step"] == step


@pytest.mark.distributed
def test_hsdp_four_processes_match_two_process_fsdp(tmp_path, data_cache):
    """HSDP (2 replicas x 2 shards) trains the same model as FSDP over 2 ranks, same global batch."""
    args = tiny_overrides(data_cache, steps=3) + ["train.global_batch_size=8", "checkpoint.save_at_end=false"]
    fsdp = run_cli(args, tmp_path / "fsdp", nproc=2)
    assert fsdp.returncode == 0, fsdp.stderr[-3000:]
    hsdp = run_cli(args + ["parallel=hsdp", "parallel.dp_shard=2", "parallel.compile=false",
                           "parallel.activation_checkpoint=none", "parallel.param_dtype=float32"],
                   tmp_path / "hsdp", nproc=4)
    assert hsdp.returncode == 0, hsdp.stderr[-3000:]
    expected, got = losses_by_step(tmp_path / "fsdp"), losses_by_step(tmp_path / "hsdp")
    assert sorted(got) == [1, 2, 3]
    for step in got:
        assert got[step] == pytest.approx(expected[step], rel=2e-3)
