"""Checkpoint faults that only two ranks can show: damage seen by one rank's share of the hashing, and a
write that fails on one rank only. Every rank must reach the same verdict, or the others would load a
corrupt checkpoint, or commit one without that rank's shards, or hang."""

from __future__ import annotations

import json
import resource
import shutil
import signal

import pytest

from trainer.checkpoint.integrity import MANIFEST_NAME, verify_directory
from trainer_testing import launch_ranks, losses_by_step, read_jsonl, run_cli, tiny_overrides

ARGS = ["checkpoint.every=2", "checkpoint.keep=0", "optim.schedule=constant"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_cache):
    """A 2-process run with checkpoints at steps 2, 4 and 6."""
    run_dir = tmp_path_factory.mktemp("two-rank-reference")
    result = run_cli(tiny_overrides(data_cache, steps=6) + ARGS, run_dir, nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def _stopped_after_step_4(reference, run_dir):
    shutil.copytree(reference, run_dir, ignore=shutil.ignore_patterns("metrics.jsonl", "events.jsonl"))
    shutil.rmtree(run_dir / "checkpoints" / "step_00000006")
    return run_dir / "checkpoints"


@pytest.mark.distributed
def test_damage_hashed_by_rank_1_makes_both_ranks_fall_back(reference, tmp_path, data_cache):
    checkpoints = _stopped_after_step_4(reference, tmp_path / "run")
    newest = checkpoints / "step_00000004"
    files = sorted(json.loads((newest / MANIFEST_NAME).read_text())["files"])
    hashed_by_rank_1 = [name for name in files[1::2] if name.endswith(".distcp")][0]
    damaged = newest / hashed_by_rank_1
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    assert verify_directory(newest, hash_files=True, rank=0, world_size=2) == []  # rank 0 alone sees nothing
    assert verify_directory(newest, hash_files=True, rank=1, world_size=2) != []

    result = run_cli(tiny_overrides(data_cache, steps=6) + ARGS, tmp_path / "run", nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (checkpoints / "corrupt_step_00000004").is_dir()
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    assert [e["step"] for e in events if e["event"] == "resumed"] == [2]
    assert str(damaged) in next(e for e in events if e["event"] == "checkpoint_set_aside")["reason"]
    expected = losses_by_step(reference)
    assert losses_by_step(tmp_path / "run") == {step: expected[step] for step in (3, 4, 5, 6)}


def _small_file_limit():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (128 << 10, 128 << 10))


@pytest.mark.distributed
def test_a_write_failing_on_rank_1_only_stops_both_ranks_and_commits_nothing(reference, tmp_path, data_cache):
    checkpoints = _stopped_after_step_4(reference, tmp_path / "run")
    # Only rank 1's process may not write files over 128 KB: its half of the next checkpoint fails.
    ranks = launch_ranks(tiny_overrides(data_cache, steps=6) + ARGS, tmp_path / "run", tmp_path,
                         preexec_fns=[None, _small_file_limit])
    for process, _ in ranks:
        process.wait(timeout=300)
    for rank, (process, log) in enumerate(ranks):
        output = log.read_text()
        assert process.returncode != 0, output[-3000:]
        assert "CheckpointSaveError: saving checkpoint" in output and "step_00000006 failed: rank 1: file too " \
               "large" in output, (rank, output[-3000:])
    assert sorted(p.name for p in checkpoints.iterdir() if p.name != "trainer.lock") == ["step_00000002", "step_00000004"]
    assert verify_directory(checkpoints / "step_00000004", hash_files=True) == []
