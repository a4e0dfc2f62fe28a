"""Corrupt, incomplete, crafted or foreign checkpoints: named by path, never trained on, never unpickled.

Faults are made from outside, on disk, as a failing disk, an interrupted copy or an attacker
would leave them; the runs are the tiny model in this process.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest

from trainer.checkpoint.errors import CorruptCheckpoint, IncompatibleCheckpoint
from trainer.checkpoint.integrity import MANIFEST_NAME, describe_file, verify_directory
from trainer.checkpoint.layout import read_trainer_state
from trainer.loop import train
from trainer_testing import ROOT, compose_train_config, losses_by_step, read_jsonl, tiny_overrides

STEPS = 6


def _overrides(data_cache, *extra, steps=STEPS):
    # A constant schedule: the lr of a step does not depend on train.steps, so a shorter first run
    # followed by a resume is comparable with one uninterrupted run.
    return tiny_overrides(data_cache, steps=steps) + ["checkpoint.every=2", "checkpoint.keep=0",
                                                      "optim.schedule=constant", *extra]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_cache):
    """One uninterrupted run with checkpoints at steps 2, 4, 6 (kept), and its losses."""
    run_dir = tmp_path_factory.mktemp("integrity-reference")
    train(compose_train_config(_overrides(data_cache), run_dir))
    return run_dir


def _copy_run(reference: Path, tmp_path: Path) -> Path:
    """The reference run's directory with only its checkpoints 2 and 4: as if it stopped after step 4."""
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir, ignore=shutil.ignore_patterns("metrics.jsonl", "events.jsonl"))
    shutil.rmtree(run_dir / "checkpoints" / "step_00000006")
    return run_dir


def _flip_16_bytes_in_a_tensor(checkpoint: Path) -> Path:
    shard = sorted(checkpoint.glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2  # inside the stored tensors: DCP writes raw tensor bytes back to back
    data[middle:middle + 16] = bytes(b ^ 0x5A for b in data[middle:middle + 16])
    shard.write_bytes(bytes(data))
    return shard


def _truncate_distcp(checkpoint: Path) -> Path:
    shard = sorted(checkpoint.glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[:-100])
    return shard


def _junk_trainer_state(checkpoint: Path) -> Path:
    path = checkpoint / "trainer_state.json"
    path.write_bytes(b"\x00junk" * (path.stat().st_size // 5) + b"\x00" * (path.stat().st_size % 5))
    return path


def _junk_rng(checkpoint: Path) -> Path:
    path = checkpoint / "rng_rank0.json"
    path.write_bytes(os.urandom(path.stat().st_size))
    return path


def _empty_rng(checkpoint: Path) -> Path:
    path = checkpoint / "rng_rank0.json"
    path.write_bytes(b"")
    return path


def _no_metadata(checkpoint: Path) -> Path:
    (checkpoint / ".metadata").unlink()
    return checkpoint / ".metadata"


def _no_manifest(checkpoint: Path) -> Path:
    (checkpoint / MANIFEST_NAME).unlink()
    return checkpoint / MANIFEST_NAME


CORRUPTIONS = [_flip_16_bytes_in_a_tensor, _truncate_distcp, _junk_trainer_state, _junk_rng, _empty_rng,
               _no_metadata, _no_manifest]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda function: function.__name__.strip("_"))
def test_verification_names_the_damaged_file(reference, tmp_path, corrupt):
    checkpoint = tmp_path / "step_00000004"
    shutil.copytree(reference / "checkpoints" / "step_00000004", checkpoint)
    assert verify_directory(checkpoint, hash_files=True) == []
    damaged = corrupt(checkpoint)
    problems = verify_directory(checkpoint, hash_files=True)
    assert problems and str(damaged) in problems[0], problems
    if corrupt in (_flip_16_bytes_in_a_tensor, _junk_rng, _junk_trainer_state, _no_manifest):
        # same size: only the checksum sees it; checkpoint.verify=false knowingly skips that (and
        # accepts a checkpoint without a manifest, as trainers before checksums wrote them)
        assert verify_directory(checkpoint, hash_files=False) == []
    else:
        assert verify_directory(checkpoint, hash_files=False) != []  # sizes are always checked


@pytest.mark.parametrize("corrupt", [_flip_16_bytes_in_a_tensor, _junk_trainer_state, _no_metadata],
                         ids=lambda function: function.__name__.strip("_"))
def test_corrupt_latest_checkpoint_falls_back_and_training_matches_the_reference(reference, tmp_path, data_cache,
                                                                                 corrupt):
    run_dir = _copy_run(reference, tmp_path)
    damaged = corrupt(run_dir / "checkpoints" / "step_00000004")
    train(compose_train_config(_overrides(data_cache), run_dir))
    events = read_jsonl(run_dir / "events.jsonl")
    set_aside = [e for e in events if e["event"] == "checkpoint_set_aside"]
    assert len(set_aside) == 1 and str(damaged) in set_aside[0]["reason"], set_aside
    assert (run_dir / "checkpoints" / "corrupt_step_00000004").is_dir()  # kept for inspection, not deleted
    assert [e["step"] for e in events if e["event"] == "resumed"] == [2]
    # never trained on corrupted state: steps 3-6 repeat the uninterrupted run exactly
    resumed = losses_by_step(run_dir)
    assert sorted(resumed) == [3, 4, 5, 6]
    expected = losses_by_step(reference)
    assert resumed == {step: expected[step] for step in resumed}


def test_on_corrupt_stop_names_the_checkpoint_and_touches_nothing(reference, tmp_path, data_cache):
    run_dir = _copy_run(reference, tmp_path)
    shard = _truncate_distcp(run_dir / "checkpoints" / "step_00000004")
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name != "trainer.lock")
    with pytest.raises(CorruptCheckpoint, match=re.escape(str(shard)) + ".*on_corrupt=stop"):
        train(compose_train_config(_overrides(data_cache, "checkpoint.on_corrupt=stop"), run_dir))
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name != "trainer.lock") == before


def test_no_intact_checkpoint_stops_instead_of_starting_afresh(reference, tmp_path, data_cache):
    run_dir = _copy_run(reference, tmp_path)
    for name in ("step_00000002", "step_00000004"):
        _flip_16_bytes_in_a_tensor(run_dir / "checkpoints" / name)
    with pytest.raises(CorruptCheckpoint, match="no intact checkpoint.*step_00000004.*step_00000002.*resume=none"):
        train(compose_train_config(_overrides(data_cache), run_dir))
    assert not (run_dir / "metrics.jsonl").exists()  # not one step trained


def test_explicit_resume_path_that_is_corrupt_stops(reference, tmp_path, data_cache):
    run_dir = _copy_run(reference, tmp_path)
    checkpoint = run_dir / "checkpoints" / "step_00000002"
    damaged = _junk_rng(checkpoint)
    with pytest.raises(CorruptCheckpoint, match=re.escape(str(damaged))):
        train(compose_train_config(_overrides(data_cache, f"checkpoint.resume={checkpoint}"), tmp_path / "other"))


# ----------------------------------------------------------------------------- nothing is unpickled
class _RunsAShellCommand:
    """A pickle that, once unpickled, creates a marker file (what a crafted checkpoint file would do)."""

    marker: str = ""

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _crafted_pickle(marker: Path) -> bytes:
    payload = _RunsAShellCommand()
    payload.marker = str(marker)
    _RunsAShellCommand.marker = str(marker)
    return pickle.dumps(payload)


def _rewrite_manifest(checkpoint: Path) -> None:
    """What an attacker would also do: record the crafted file's checksum."""
    manifest = json.loads((checkpoint / MANIFEST_NAME).read_text())
    for name in list(manifest["files"]):
        manifest["files"][name] = describe_file(checkpoint / name)
    for extra in checkpoint.iterdir():
        if extra.name != MANIFEST_NAME:
            manifest["files"][extra.name] = describe_file(extra)
    (checkpoint / MANIFEST_NAME).write_text(json.dumps(manifest))


@pytest.mark.parametrize("target", ["rng_rank0.json", "trainer_state.json", "rng_rank0.pt"])
def test_crafted_pickles_in_checkpoint_files_never_run(reference, tmp_path, data_cache, target):
    run_dir = _copy_run(reference, tmp_path)
    checkpoint = run_dir / "checkpoints" / "step_00000004"
    marker = tmp_path / "pwned"
    (checkpoint / target).write_bytes(_crafted_pickle(marker))  # rng_rank0.pt: the old RNG file name
    _rewrite_manifest(checkpoint)
    cfg = compose_train_config(_overrides(data_cache, "checkpoint.on_corrupt=stop"), run_dir)
    if target.endswith(".pt"):
        train(cfg)  # not a file the trainer reads: ignored, the run resumes and finishes
        assert read_trainer_state(run_dir / "checkpoints" / "step_00000006")["step"] == 6
    else:
        with pytest.raises(CorruptCheckpoint, match=re.escape(str(checkpoint / target))):
            train(cfg)
    assert not marker.exists()


def test_metadata_is_verified_before_dcp_unpickles_it(reference, tmp_path, data_cache):
    run_dir = _copy_run(reference, tmp_path)
    checkpoint = run_dir / "checkpoints" / "step_00000004"
    marker = tmp_path / "pwned"
    (checkpoint / ".metadata").write_bytes(_crafted_pickle(marker))  # not re-recorded: a damaged file
    with pytest.raises(CorruptCheckpoint, match=re.escape(str(checkpoint / ".metadata"))):
        train(compose_train_config(_overrides(data_cache, "checkpoint.on_corrupt=stop"), run_dir))
    assert not marker.exists()


def test_trainer_code_never_unpickles():
    """Static guard on the rule above: no pickle module, no torch.load without weights_only=True in trainer/."""
    for path in (ROOT / "trainer").rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"^\s*(import pickle|from pickle)", text, re.M), path
        assert "pickle.load" not in text and "weights_only=False" not in text, path
        for call in re.findall(r"torch\.load\([^)]*\)", text):
            assert "weights_only=True" in call, (path, call)


# ----------------------------------------------------------------------------- another model
def test_resume_into_another_model_stops_naming_both_values(reference, tmp_path, data_cache):
    run_dir = _copy_run(reference, tmp_path)
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name != "trainer.lock")
    cfg = compose_train_config(_overrides(data_cache, "model.pattern=M-M*", "checkpoint.keep=1"), run_dir)
    with pytest.raises(IncompatibleCheckpoint, match=r"model.pattern: checkpoint 'M-M\*M-', this run 'M-M\*'"):
        train(cfg)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name != "trainer.lock") == before  # nothing pruned
    cfg = compose_train_config(_overrides(data_cache, "model.hidden_size=48", "model.ffn_hidden_size=96"), run_dir)
    with pytest.raises(IncompatibleCheckpoint, match="model.hidden_size: checkpoint 64, this run 48"):
        train(cfg)


def test_allow_model_change_loads_what_matches_and_keeps_the_other_models_checkpoints(reference, tmp_path,
                                                                                       data_cache):
    run_dir = _copy_run(reference, tmp_path)
    cfg = compose_train_config(_overrides(data_cache, "model.pattern=M-M*", "checkpoint.keep=1",
                                          "checkpoint.allow_model_change=true", steps=8), run_dir)
    summary = train(cfg)
    assert summary["step"] == 8
    changed = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "model_changed_on_resume"]
    assert len(changed) == 1 and any("model.pattern" in change for change in changed[0]["changes"])
    assert "layers.4.mixer.in_proj.weight" in changed[0]["dropped"] and changed[0]["initialized"] == []
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name != "trainer.lock")
    # keep=1 prunes among the 4-block checkpoints (6 went, 8 stays); the 6-block ones stay
    assert names == ["step_00000002", "step_00000004", "step_00000008"]
    assert read_trainer_state(run_dir / "checkpoints" / "step_00000008")["model_config"]["pattern"] == "M-M*"


def test_model_comparison_ignores_labels_kernels_and_init_but_not_what_the_weights_compute():
    import dataclasses

    from models.config import ModelConfig
    from trainer.checkpoint.compatibility import layout_differences, model_config_differences

    saved = dataclasses.asdict(ModelConfig())
    same = dict(saved, name="renamed", ssd_backend="torch", conv_backend="conv1d", chunk_size=32, init_std=0.01)
    assert model_config_differences(saved, same) == []
    assert model_config_differences(saved, dict(saved, norm_eps=1e-6)) == [
        "model.norm_eps: checkpoint 1e-05, this run 1e-06"]
    layout = {"a.weight": [4, 4], "b.weight": [4]}
    assert layout_differences(layout, dict(layout)) == []
    assert layout_differences(layout, {"a.weight": [4, 8], "c.weight": [4]}) == [
        "1 entries only in the checkpoint (b.weight)", "1 entries only in this run's model (c.weight)",
        "a.weight: checkpoint shape [4, 4], this run [4, 8]"]
