"""What a resume compares and records besides the model: tokenizer and corpus (refused unless allowed),
every other config change (an event with both values), each start's config (kept), train.steps against
the step reached, the optimizer's step count against the trainer's. Also: a same-step checkpoint of
another history is moved aside, never deleted, and a log that cannot be written stops the run after a
checkpoint. Runs are the tiny model in this process."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from trainer.checkpoint.errors import CorruptCheckpoint, IncompatibleCheckpoint
from trainer.guards import RunStopped
from trainer.checkpoint.integrity import describe_files, verify_directory, write_manifest
from trainer.checkpoint.layout import read_trainer_state
from trainer.loop import train
from trainer.run_lock import RunLock
from trainer.validate import ConfigError
from trainer_testing import compose_train_config, read_jsonl, tiny_overrides


def _overrides(data_cache, *extra, steps=4):
    return tiny_overrides(data_cache, steps=steps) + ["checkpoint.every=2", *extra]


@pytest.fixture(scope="module")
def base(tmp_path_factory, data_cache):
    """A run of 4 steps with checkpoints at steps 2 and 4."""
    run_dir = tmp_path_factory.mktemp("resume-checks") / "run"
    train(compose_train_config(_overrides(data_cache), run_dir))
    return run_dir


@pytest.fixture
def run_dir(base, tmp_path):
    """A copy of the base run to resume (the lock file is not part of what is copied)."""
    copy = tmp_path / "run"
    shutil.copytree(base, copy, ignore=shutil.ignore_patterns("trainer.lock"))
    return copy


def _events(run_dir, name):
    return [event for event in read_jsonl(run_dir / "events.jsonl") if event["event"] == name]


def _checkpoints(run_dir):
    return sorted(path.name for path in (run_dir / "checkpoints").iterdir() if path.name != "trainer.lock")


def test_another_tokenizer_or_corpus_is_refused_naming_both_unless_allowed(run_dir, data_cache):
    before = _checkpoints(run_dir)
    other_tokenizer = compose_train_config(_overrides(data_cache, "data.builtin_vocab_size=400", steps=5), run_dir)
    with pytest.raises(IncompatibleCheckpoint) as refused:
        train(other_tokenizer)
    message = str(refused.value)
    assert "tokenizer: checkpoint 'builtin-bpe-v512" in message and "vocab 512" in message, message
    assert "this run 'builtin-bpe-v400" in message and "vocab 400" in message, message
    assert "corpus: source 'builtin'" in message  # shards made with another tokenizer are other data too
    assert "checkpoint.allow_tokenizer_change=true" in message and "Nothing was loaded" in message
    assert _checkpoints(run_dir) == before and not _events(run_dir, "resumed")

    other_corpus = compose_train_config(_overrides(data_cache, "data.validation_fraction=0.5", steps=5), run_dir)
    with pytest.raises(IncompatibleCheckpoint, match="corpus: source 'builtin': checkpoint .*manifest.json") as refused:
        train(other_corpus)
    assert "tokenizer:" not in str(refused.value)

    allowed = compose_train_config(_overrides(data_cache, "data.builtin_vocab_size=400", steps=5,
                                              *["checkpoint.allow_tokenizer_change=true",
                                                "checkpoint.allow_data_change=true"]), run_dir)
    assert train(allowed)["step"] == 5
    tokenizer = _events(run_dir, "tokenizer_changed_on_resume")
    assert len(tokenizer) == 1 and tokenizer[0]["step"] == 4
    assert (tokenizer[0]["old"]["vocab_size"], tokenizer[0]["new"]["vocab_size"]) == (512, 400)
    assert tokenizer[0]["option"] == "checkpoint.allow_tokenizer_change"
    corpus = _events(run_dir, "data_changed_on_resume")
    assert len(corpus) == 1 and set(corpus[0]["sources"]) == {"builtin"}
    change = corpus[0]["sources"]["builtin"]
    assert change["old"]["sha256"] != change["new"]["sha256"]


def test_config_changes_on_resume_are_events_and_each_start_keeps_its_config(base, run_dir, data_cache):
    first_config = (run_dir / "config.yaml").read_text()
    changed = compose_train_config(_overrides(data_cache, "optim.lr=1e-3", "train.global_batch_size=2",
                                              "precision.bf16_layers_at_end=2", steps=6), run_dir)
    assert train(changed)["step"] == 6
    events = _events(run_dir, "config_changed_on_resume")
    assert len(events) == 1 and events[0]["step"] == 4
    assert events[0]["changes"] == {"train.steps": [4, 6], "optim.lr": [0.003, 0.001],
                                    "train.global_batch_size": [4, 2], "precision.bf16_layers_at_end": [1, 2],
                                    "run_dir": [str(base), str(run_dir)]}  # the copy is another directory
    # the 4-step WSD schedule had decayed to min_lr at step 4; the 6-step one decays only in its last step
    assert events[0]["lr_at_resume"] == [pytest.approx(3e-5), pytest.approx(1e-3)]
    # nothing overwritten: the first start's config and this start's, side by side
    assert (run_dir / "config.yaml").read_text() == first_config
    assert yaml.safe_load(first_config)["train"]["steps"] == 4
    assert yaml.safe_load((run_dir / "config.resume-00000004.yaml").read_text())["train"]["steps"] == 6
    assert json.loads((run_dir / "run_info.resume-00000004.json").read_text())["name"] == "test"
    RunLock(run_dir).acquire()  # released when the run ended


def test_fewer_steps_than_reached_is_refused_and_as_many_says_nothing_is_left(run_dir, data_cache, capsys):
    with pytest.raises(ConfigError, match=r"train.steps=3 is below step 4, where checkpoint .*step_00000004 stands: "
                                          "nothing would be trained"):
        train(compose_train_config(_overrides(data_cache, steps=3), run_dir))
    lines = len(read_jsonl(run_dir / "metrics.jsonl"))
    summary = train(compose_train_config(_overrides(data_cache, steps=4), run_dir))
    assert summary["step"] == 4 and summary["losses"] == []
    assert "train.steps=4 is reached already" in capsys.readouterr().out
    assert len(read_jsonl(run_dir / "metrics.jsonl")) == lines


def test_an_optimizer_state_of_another_step_is_refused(run_dir, data_cache):
    """The .distcp files of step 2 put into step 4, integrity.json rewritten to match: every file verifies,
    but the Adam state has taken 2 updates where trainer_state.json records 4."""
    newest, older = run_dir / "checkpoints" / "step_00000004", run_dir / "checkpoints" / "step_00000002"
    for shard in older.glob("*.distcp"):
        shutil.copyfile(shard, newest / shard.name)
    names = sorted(path.name for path in newest.iterdir() if path.name != "integrity.json")
    write_manifest(newest, describe_files(newest, names))
    assert verify_directory(newest, hash_files=True) == []
    with pytest.raises(CorruptCheckpoint, match=r"step_00000004: its optimizer state has taken 2 updates \(as rank 0 "
                                                r"loaded it\), but trainer_state.json records 4 \(step 4, 0 non-finite"):
        train(compose_train_config(_overrides(data_cache, steps=5), run_dir))
    assert read_trainer_state(older)["optimizer_step"] == 2


def test_a_same_step_checkpoint_of_another_history_is_moved_aside_not_deleted(run_dir, data_cache):
    old = read_trainer_state(run_dir / "checkpoints" / "step_00000002")
    train(compose_train_config(_overrides(data_cache, "checkpoint.resume=none", "seed=7", steps=2), run_dir))
    moved = run_dir / "checkpoints" / "superseded_step_00000002"
    assert read_trainer_state(moved) == old and verify_directory(moved, hash_files=True) == []
    assert read_trainer_state(run_dir / "checkpoints" / "step_00000002")["seed"] == 7


def test_a_log_that_cannot_be_written_stops_after_a_checkpoint_naming_the_file(tmp_path, data_cache):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.symlink("/dev/full", run_dir / "metrics.jsonl")  # every write: ENOSPC, as on a full disk
    with pytest.raises(RunStopped) as stopped:
        train(compose_train_config(_overrides(data_cache, steps=3), run_dir))
    message = str(stopped.value)
    assert f"no space left on device (OSError [Errno 28] No space left on device) writing {run_dir / 'metrics.jsonl'}" \
        in message, message
    assert f"Checkpoint {run_dir / 'checkpoints' / 'step_00000001'} holds step 1" in message
    assert verify_directory(run_dir / "checkpoints" / "step_00000001", hash_files=True) == []
    RunLock(Path(run_dir)).acquire()
