"""Preparation through datasets: local jsonl / parquet / text, round trips, streaming, parallelism, resume."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import data.prepare as prepare_module
from data import build_tokenizer, ensure_prepared, prepare_source
from data.shards import open_split
from data_testing import ascii_documents, files_config, sample_documents, shared_builtin_cache, write_jsonl

EOS_TEXT = "<|endoftext|>"


def decoded_documents(directory: Path, split: str, tokenizer) -> list[str]:
    """Each document of a prepared split, decoded, by the offsets index (the EOS checked and removed)."""
    stream = open_split(directory, split, expected_tokenizer=tokenizer.identity)
    documents = []
    for shard in stream.shards:
        tokens = np.fromfile(shard.tokens_path, dtype="<u4")  # read independently of the loader's memmaps
        offsets = np.load(shard.index_path)
        for start, end in zip(offsets[:-1], offsets[1:]):
            assert tokens[end - 1] == tokenizer.eos_id
            documents.append(tokenizer.decode(tokens[start : end - 1].tolist()))
    return documents


def check_round_trip(directory: Path, texts: list[str], tokenizer) -> None:
    """Train and validation documents partition the source, in order, and the streams decode to the joined text."""
    train = decoded_documents(directory, "train", tokenizer)
    validation = decoded_documents(directory, "validation", tokenizer)
    assert len(train) + len(validation) == len(texts) and validation and train
    positions = {text: index for index, text in enumerate(texts)}
    assert sorted(train + validation, key=positions.__getitem__) == texts
    assert [positions[text] for text in train] == sorted(positions[text] for text in train)
    stream = open_split(directory, "train", expected_tokenizer=tokenizer.identity)
    all_tokens = np.concatenate([np.fromfile(shard.tokens_path, dtype="<u4") for shard in stream.shards])
    assert tokenizer.decode(all_tokens.tolist()) == "".join(text + EOS_TEXT for text in train)


def shard_digests(directory: Path) -> list[str]:
    manifest = json.loads((directory / "manifest.json").read_text())
    return [entry["bin_sha256"] for entry in manifest["shards"]] + [entry["index_sha256"] for entry in manifest["shards"]]


def test_jsonl_round_trip_in_several_shards(tmp_path):
    texts = sample_documents(60, seed=1)
    write_jsonl(tmp_path / "corpus" / "part-0.jsonl", texts[:35])
    write_jsonl(tmp_path / "corpus" / "part-1.jsonl", texts[35:])
    cfg = files_config(shared_builtin_cache(), tmp_path / "corpus", prepared_dir=str(tmp_path / "prepared"),
                       documents_per_shard=16, validation_fraction=0.2)
    tokenizer = build_tokenizer(cfg)
    manifest = prepare_source(cfg, cfg.sources[0], tokenizer, progress=False)
    assert manifest["documents"] == 60 and len(manifest["shards"]) == 2 * 4
    assert manifest["tokenizer"] == tokenizer.identity
    assert manifest["splits"]["train"]["documents"] + manifest["splits"]["validation"]["documents"] == 60
    check_round_trip(tmp_path / "prepared" / "local", texts, tokenizer)


def test_parquet_and_text_files_round_trip(tmp_path):
    texts = sample_documents(40, seed=2)
    (tmp_path / "pq").mkdir()
    pq.write_table(pa.table({"content": texts[:25]}), tmp_path / "pq" / "a.parquet")
    pq.write_table(pa.table({"content": texts[25:]}), tmp_path / "pq" / "b.parquet")
    cfg = files_config(shared_builtin_cache(), tmp_path / "pq", text_field="content", prepared_dir=str(tmp_path / "out"),
                       validation_fraction=0.2)
    tokenizer = build_tokenizer(cfg)
    prepare_source(cfg, cfg.sources[0], tokenizer, progress=False)
    check_round_trip(tmp_path / "out" / "local", texts, tokenizer)
    # plain text files, one document per file (glob path)
    for index, text in enumerate(texts[:12]):
        (tmp_path / "txt").mkdir(exist_ok=True)
        (tmp_path / "txt" / f"{index:02d}.txt").write_text(text, encoding="utf-8")
    cfg = files_config(shared_builtin_cache(), str(tmp_path / "txt" / "*.txt"), prepared_dir=str(tmp_path / "out2"),
                       validation_fraction=0.2)
    prepare_source(cfg, cfg.sources[0], tokenizer, progress=False)
    check_round_trip(tmp_path / "out2" / "local", texts[:12], tokenizer)


def test_streaming_and_parallel_preparation_give_identical_shards(tmp_path, monkeypatch):
    import datasets

    processes = []
    real_map = datasets.Dataset.map

    def recording_map(self, *args, **kwargs):
        processes.append(kwargs.get("num_proc"))
        return real_map(self, *args, **kwargs)

    monkeypatch.setattr(datasets.Dataset, "map", recording_map)
    texts = ascii_documents(90, seed=3)
    write_jsonl(tmp_path / "c.jsonl", texts)
    common = dict(documents_per_shard=25, validation_fraction=0.1)
    digests = {}
    for label, options in {"serial": dict(num_proc=1), "parallel": dict(num_proc=2), "stream": dict(streaming=True)}.items():
        cfg = files_config(shared_builtin_cache(), tmp_path / "c.jsonl", prepared_dir=str(tmp_path / label), **common, **options)
        prepare_source(cfg, cfg.sources[0], build_tokenizer(cfg), progress=False)
        digests[label] = shard_digests(tmp_path / label / "local")
    assert digests["serial"] == digests["parallel"] == digests["stream"]
    assert processes == [None] * 4 + [2] * 4  # 4 chunks in-process, then 4 with two worker processes
    check_round_trip(tmp_path / "stream" / "local", texts, build_tokenizer(cfg))


class Interrupted(Exception):
    pass


def test_interrupted_preparation_resumes_without_redoing_finished_shards(tmp_path, monkeypatch):
    texts = ascii_documents(50, seed=4)
    write_jsonl(tmp_path / "c.jsonl", texts)
    cfg = files_config(shared_builtin_cache(), tmp_path / "c.jsonl", prepared_dir=str(tmp_path / "out"),
                       documents_per_shard=10, validation_fraction=0.1)
    tokenizer = build_tokenizer(cfg)
    directory = tmp_path / "out" / "local"
    real = prepare_module._tokenize_indexed
    tokenized: list[int] = []

    def interrupt_at_chunk_3(dataset, first, end, **options):
        if options["chunk"] == 3:
            raise Interrupted("simulated kill")
        tokenized.append(options["chunk"])
        return real(dataset, first, end, **options)

    monkeypatch.setattr(prepare_module, "_tokenize_indexed", interrupt_at_chunk_3)
    with pytest.raises(Interrupted):
        prepare_source(cfg, cfg.sources[0], tokenizer, progress=False)
    assert tokenized == [0, 1, 2] and not (directory / "manifest.json").exists()
    finished = {path.name: path.stat().st_mtime_ns for path in directory.glob("*-0000[012]*")}
    assert len(finished) == 3 * 5  # train/validation .bin and .idx.npy, and the record, per chunk
    (directory / "train-00003.bin").write_bytes(b"torn write")  # a partial file the kill left behind

    def count(dataset, first, end, **options):
        tokenized.append(options["chunk"])
        return real(dataset, first, end, **options)

    tokenized.clear()
    monkeypatch.setattr(prepare_module, "_tokenize_indexed", count)
    prepare_source(cfg, cfg.sources[0], tokenizer, progress=False)
    assert tokenized == [3, 4]
    assert {name: (directory / name).stat().st_mtime_ns for name in finished} == finished
    check_round_trip(directory, texts, tokenizer)

    # a finished shard that no longer matches its checksum is redone, and only that chunk
    clean = shard_digests(directory)
    shard = directory / "train-00001.bin"
    corrupted = bytearray(shard.read_bytes())
    corrupted[0] ^= 0xFF
    shard.write_bytes(bytes(corrupted))
    (directory / "manifest.json").unlink()
    tokenized.clear()
    prepare_source(cfg, cfg.sources[0], tokenizer, progress=False)
    assert tokenized == [1] and shard_digests(directory) == clean


def test_interrupted_streaming_preparation_resumes(tmp_path, monkeypatch):
    texts = ascii_documents(45, seed=5)
    write_jsonl(tmp_path / "c.jsonl", texts)
    cfg = files_config(shared_builtin_cache(), tmp_path / "c.jsonl", prepared_dir=str(tmp_path / "out"), streaming=True,
                       documents_per_shard=10, validation_fraction=0.1)
    tokenizer = build_tokenizer(cfg)
    real = prepare_module._tokenize_texts
    firsts: list[int] = []

    def interrupt_at_20(texts_, **options):
        if options["first_document"] == 20 and not firsts.count(-1):
            firsts.append(-1)
            raise Interrupted("simulated kill")
        firsts.append(options["first_document"])
        return real(texts_, **options)

    monkeypatch.setattr(prepare_module, "_tokenize_texts", interrupt_at_20)
    with pytest.raises(Interrupted):
        prepare_source(cfg, cfg.sources[0], tokenizer, progress=False)
    prepare_source(cfg, cfg.sources[0], tokenizer, progress=False)
    assert firsts == [0, 10, -1, 20, 30, 40]
    check_round_trip(tmp_path / "out" / "local", texts, tokenizer)


def _prepare_in_child(cfg, log_path: str) -> None:
    real = prepare_module.prepare_source

    def logged(*args, **kwargs):
        with open(log_path, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        time.sleep(1.0)  # hold the lock long enough for the other child to arrive while the work is unfinished
        return real(*args, **kwargs)

    prepare_module.prepare_source = logged
    ensure_prepared(cfg, cfg.sources[0], build_tokenizer(cfg), progress=False)


def test_concurrent_processes_prepare_a_source_once(tmp_path):
    write_jsonl(tmp_path / "c.jsonl", ascii_documents(30, seed=6))
    cfg = files_config(str(tmp_path / "cache"), tmp_path / "c.jsonl")
    build_tokenizer(cfg)  # trained before forking
    context = multiprocessing.get_context("fork")
    log_path = str(tmp_path / "prepared-by.txt")
    children = [context.Process(target=_prepare_in_child, args=(cfg, log_path)) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=120)
        assert child.exitcode == 0
    assert len(Path(log_path).read_text().split()) == 1
    directory = ensure_prepared(cfg, cfg.sources[0], build_tokenizer(cfg))
    assert directory.parent == tmp_path / "cache" / "prepared"
    open_split(directory, "train", expected_tokenizer=build_tokenizer(cfg).identity)
