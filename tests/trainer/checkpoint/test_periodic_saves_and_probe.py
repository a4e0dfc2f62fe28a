"""A default run never loses more than minutes: checkpoint.every_minutes saves by wall time (on by default),
and a checkpoint directory that cannot take a checkpoint stops the run before its first step."""

from __future__ import annotations

import collections
import os
import shutil
import subprocess

import pytest

from trainer.checkpoint.errors import CheckpointDirectoryUnusable
from trainer.config import compose
from trainer.loop import train
from trainer_testing import FAULT_ENTRY, compose_train_config, read_jsonl, run_cli, tiny_overrides


def _names(run_dir):
    folder = run_dir / "checkpoints"
    return sorted(p.name for p in folder.iterdir() if p.name != "trainer.lock") if folder.is_dir() else []


def test_time_based_checkpoints_are_on_by_default_and_a_crash_loses_only_the_steps_since_the_last(tmp_path,
                                                                                                   data_cache):
    assert compose().checkpoint.every_minutes == 30  # the default config saves by time, checkpoint.every=0 or not
    args = tiny_overrides(data_cache, steps=8) + ["checkpoint.every=0", "checkpoint.keep=2"]

    # without them (every_minutes=0, every=0) a crash at step 5 leaves nothing: the next start begins at step 0
    lost = run_cli(["--kill-at-step=5", *args, "checkpoint.every_minutes=0"], tmp_path / "off", module=FAULT_ENTRY)
    assert lost.returncode == 17 and _names(tmp_path / "off") == []

    # every 0.0005 minutes (30 ms, less than a step here): a crash at step 5 loses no step
    run_dir = tmp_path / "on"
    crashed = run_cli(["--kill-at-step=5", *args, "checkpoint.every_minutes=0.0005"], run_dir, module=FAULT_ENTRY)
    assert crashed.returncode == 17, crashed.stderr[-3000:]
    saved = [e["step"] for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "checkpoint"]
    assert saved and saved[-1] == 5, saved  # saved by wall time alone (checkpoint.every=0)
    assert _names(run_dir) == ["step_00000004", "step_00000005"]  # keep=2 prunes the older ones
    again = run_cli(args + ["checkpoint.every_minutes=0.0005"], run_dir)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [e["step"] for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "resumed"] == [5]


@pytest.mark.distributed
def test_two_ranks_save_by_rank_0s_clock_at_the_same_steps(tmp_path, data_cache):
    """Ranks' clocks and step times differ: the decision is rank 0's, shared every step, so both ranks enter every
    save together (a rank deciding alone would leave the other waiting in the save's collectives)."""
    from trainer.checkpoint.integrity import verify_directory

    run_dir = tmp_path / "run"
    result = run_cli(tiny_overrides(data_cache, steps=6) + ["checkpoint.every_minutes=0.0005", "checkpoint.keep=0",
                                                           "checkpoint.save_at_end=false"], run_dir, nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = [e["step"] for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "checkpoint"]
    assert len(saved) >= 2 and _names(run_dir) == [f"step_{step:08d}" for step in saved]
    for name in _names(run_dir):
        assert verify_directory(run_dir / "checkpoints" / name, hash_files=True) == []


def _make_unwritable(directory):
    """Make `directory` refuse new entries (files in it stay writable); returns how to undo it, or None."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return lambda: directory.chmod(0o755)
    if shutil.which("chattr") and subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode == 0:
        return lambda: subprocess.run(["chattr", "-i", str(directory)], check=True)
    return None


def test_a_checkpoint_directory_that_cannot_be_written_stops_the_run_before_its_first_step(tmp_path, data_cache):
    checkpoints, run_dir = tmp_path / "checkpoints", tmp_path / "run"
    checkpoints.mkdir()
    (checkpoints / "trainer.lock").write_text("")  # an earlier run's lock file: the lock itself still works
    undo = _make_unwritable(checkpoints)
    if undo is None:
        pytest.skip("cannot make a directory unwritable here (root without chattr)")
    try:
        probe = tmp_path / "checkpoints" / "probe"
        with pytest.raises(OSError):
            probe.write_text("")  # the fault is real: nothing new can be created there
        result = run_cli(tiny_overrides(data_cache, steps=50) + [f"checkpoint.dir={checkpoints}"], run_dir)
    finally:
        undo()
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert lines[0].startswith(f"CheckpointDirectoryUnusable: the checkpoint directory {checkpoints.resolve()} cannot "
                               "take a checkpoint: rank 0: ")
    assert ("permission denied" in lines[0] or "operation not permitted" in lines[0]) and "Nothing was trained" in lines[0]
    assert not run_dir.exists()  # refused before the first step: no metrics, no run directory left behind


def test_a_checkpoint_directory_without_room_for_one_checkpoint_stops_the_run_before_its_first_step(
        tmp_path, data_cache, monkeypatch):
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 30, (1 << 30) - (1 << 20), 1 << 20))  # 1 MiB free
    run_dir = tmp_path / "run"
    with pytest.raises(CheckpointDirectoryUnusable, match=r"its filesystem has 1\.0 MiB free, and one checkpoint of "
                                                          r"this model takes about 2\.3 MiB \(12 bytes per parameter"):
        train(compose_train_config(tiny_overrides(data_cache, steps=2), run_dir))
    assert not run_dir.exists()
