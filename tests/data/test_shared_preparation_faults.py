"""Preparation and training sharing prepared directories: two preparations into one directory take turns, a
prepared directory of another source is refused naming both, a micro-batch larger than the corpus is refused,
and a file that is not what the config says (a JSON that is no tokenizer, Parquet read as json) is named."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from data import build_tokenizer, build_train_loader, prepare_source
from data.errors import DataError
from data_testing import ascii_documents, files_config, shared_builtin_cache, write_jsonl

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def _prepared(tmp_path, name: str, count: int, seed: int):
    """`count` documents in tmp_path/<name>.jsonl, prepared as source 'local' into tmp_path/out/local."""
    write_jsonl(tmp_path / f"{name}.jsonl", ascii_documents(count, seed=seed))
    cfg = files_config(shared_builtin_cache(), tmp_path / f"{name}.jsonl", prepared_dir=str(tmp_path / "out"),
                       seq_len=16, validation_fraction=0.1)
    prepare_source(cfg, cfg.sources[0], build_tokenizer(cfg), progress=False)
    return cfg


def test_a_prepared_directory_of_another_source_is_refused_naming_both(tmp_path):
    _prepared(tmp_path, "small", 40, seed=1)  # data.prepared_dir holds small.jsonl's shards as source 'local'
    write_jsonl(tmp_path / "c.jsonl", ascii_documents(60, seed=2))
    other = files_config(shared_builtin_cache(), tmp_path / "c.jsonl", prepared_dir=str(tmp_path / "out"),
                         seq_len=16, validation_fraction=0.1)
    with pytest.raises(DataError, match=r"data\.prepared_dir: .*/out/local holds shards of another source than source "
                                        r"'local' \(files at .*c\.jsonl\) .*files: prepared \[\"small\.jsonl\"\], "
                                        r"configured \[\"c\.jsonl\"\]"):
        build_train_loader(other, micro_batch_size=2)
    # the same corpus copied elsewhere (another path, same file name and size) is the same source
    (tmp_path / "copy").mkdir()
    shutil.copy(tmp_path / "small.jsonl", tmp_path / "copy" / "small.jsonl")
    moved = files_config(shared_builtin_cache(), tmp_path / "copy" / "small.jsonl", prepared_dir=str(tmp_path / "out"),
                         seq_len=16, validation_fraction=0.1)
    next(build_train_loader(moved, micro_batch_size=2))
    # and shards prepared on a machine whose raw files are not here: the file name still has to agree
    os.remove(tmp_path / "copy" / "small.jsonl")
    next(build_train_loader(moved, micro_batch_size=2))
    with pytest.raises(DataError, match=r"they were prepared from \['small\.jsonl'\], this source reads .*/gone\.jsonl"):
        build_train_loader(files_config(shared_builtin_cache(), tmp_path / "gone.jsonl", seq_len=16,
                                        prepared_dir=str(tmp_path / "out"), validation_fraction=0.1), micro_batch_size=2)


def test_a_micro_batch_larger_than_the_corpus_is_refused_naming_the_sizes(tmp_path):
    cfg = _prepared(tmp_path, "small", 40, seed=3)
    loader = build_train_loader(cfg, micro_batch_size=4)
    windows = loader.samplers[0].num_windows
    with pytest.raises(DataError, match=rf"train\.micro_batch_size={2 * windows} x 1 data-parallel rank\(s\) = "
                                        rf"{2 * windows} sequences per micro-batch draw about {2 * windows} windows from "
                                        rf"source 'local', whose train split has only {windows} windows of 17 tokens"):
        build_train_loader(cfg, micro_batch_size=2 * windows)
    with pytest.raises(DataError, match=r"repeated 2\.0 times within each batch"):
        build_train_loader(cfg, micro_batch_size=windows, dp_rank=1, dp_world_size=2)
    build_train_loader(cfg, micro_batch_size=windows)  # each window once per batch: allowed


def test_two_preparations_into_one_directory_take_turns_and_both_succeed(tmp_path):
    write_jsonl(tmp_path / "corpus.jsonl", ascii_documents(3000, seed=4))
    command = [sys.executable, "-m", "trainer.prepare_data", "--no-progress", "--source", "files",
               "--path", str(tmp_path / "corpus.jsonl"), "--out", str(tmp_path / "out"), "--num-proc", "1",
               f"cache_dir={shared_builtin_cache()}", "builtin_vocab_size=1024", "builtin_corpus_mb=0.25",
               "documents_per_shard=150"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    runs = [subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True) for _ in range(2)]
    outputs = [run.communicate(timeout=600)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    assert not any("Traceback" in output for output in outputs), outputs
    assert any("another process is preparing" in output for output in outputs), outputs  # they did overlap
    assert all("prepared and verified" in output for output in outputs)
    verify = subprocess.run(command + ["--verify"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0, verify.stderr[-3000:]
    # a third with other settings into the same directory: refused in one line, the work there kept
    other = subprocess.run(command[:-1] + ["documents_per_shard=100"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300)
    assert other.returncode == 2 and "Traceback" not in other.stderr, other.stderr[-3000:]
    assert other.stderr.strip().splitlines()[-1].startswith(f"prepare_data: {tmp_path / 'out' / 'corpus.jsonl'} holds "
                                                            "work prepared with other settings (documents_per_shard")


def test_a_json_file_that_is_no_tokenizer_is_named_with_what_it_is(tmp_path):
    from data import DataConfig

    config = tmp_path / "config.json"
    config.write_text('{"vocab_size": 512, "model_type": "nemotron_h", "hidden_size": 64}')
    with pytest.raises(DataError, match=rf"^data\.tokenizer: {config} is JSON with the keys 'vocab_size', 'model_type', "
                                        r"'hidden_size' \(a model's config\.json\?\) but not a tokenizer: it has no "
                                        r"\"model\"; expected a tokenizer\.json"):
        build_tokenizer(DataConfig(tokenizer=str(config)))
    broken = tmp_path / "tokenizer.json"
    broken.write_text('{"model": {"type": "BPE"')
    with pytest.raises(DataError, match=rf"^data\.tokenizer: {broken} is not JSON \("):
        build_tokenizer(DataConfig(tokenizer=str(broken)))


def test_a_parquet_file_read_as_json_is_named_with_the_format_to_give(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "corpus.jsonl"  # a Parquet file under a jsonl name
    pq.write_table(pa.table({"text": ascii_documents(20, seed=5)}), path)
    cfg = files_config(shared_builtin_cache(), path, file_format="json", prepared_dir=str(tmp_path / "out"))
    with pytest.raises(DataError, match=rf"data file {path} is a Parquet file \(it begins with b'PAR1'\), read as "
                                        r"file_format=json: set file_format: parquet for this source"):
        prepare_source(cfg, cfg.sources[0], build_tokenizer(cfg), progress=False)


def test_a_run_starting_while_the_script_prepares_its_directory_waits_and_uses_that_work(tmp_path, caplog):
    import logging
    import time

    write_jsonl(tmp_path / "corpus.jsonl", ascii_documents(3000, seed=6))
    script = subprocess.Popen([sys.executable, "-m", "trainer.prepare_data", "--no-progress",
                               "--source", "files", "--path", str(tmp_path / "corpus.jsonl"), "--out",
                               str(tmp_path / "out"), "--num-proc", "1", f"cache_dir={shared_builtin_cache()}",
                               "builtin_vocab_size=1024", "builtin_corpus_mb=0.25", "documents_per_shard=150"],
                              cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    directory = tmp_path / "out" / "corpus.jsonl"
    deadline = time.time() + 120
    while not (directory / "chunk-00000.json").exists():  # the script is half way: shards, no manifest yet
        assert script.poll() is None and time.time() < deadline, script.communicate()[0][-3000:]
        time.sleep(0.05)
    cfg = files_config(shared_builtin_cache(), tmp_path / "corpus.jsonl", name="corpus.jsonl", seq_len=16,
                       prepared_dir=str(tmp_path / "out"), documents_per_shard=150, validation_fraction=0.02)
    with caplog.at_level(logging.WARNING, logger="data.prepare"):
        next(build_train_loader(cfg, micro_batch_size=2))  # waits for the script, then reads its shards
    assert "another process is preparing" in caplog.text
    assert script.wait(timeout=300) == 0, script.communicate()[0][-3000:]
    assert (directory / "manifest.json").is_file()
