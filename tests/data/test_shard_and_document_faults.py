"""Shards and documents that must not fail without a word: token ids beyond the vocabulary, a shard
truncated under a running reader, a file that gives no document, empty documents, a document too long
to tokenize."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from data import DataError, build_tokenizer, prepare_source
from data.loader import PackedLoader
from data.prepare import write_token_dataset
from data.shards import open_split
from data_testing import ascii_documents, files_config, shared_builtin_cache, write_jsonl

IDENTITY = {"name": "synthetic-512", "sha256": "e" * 64, "vocab_size": 512, "eos_id": 0}


def _shards_with_a_token_beyond_the_vocabulary(directory, bad_at: int):
    """Two documents of 300 tokens below 512, except token `bad_at` of the stream, which is 700."""
    tokens = (np.arange(600) % 500 + 1).astype(np.uint32)
    tokens[bad_at] = 700
    write_token_dataset(directory, "synthetic", tokens, [300, 300], tokenizer_identity=IDENTITY,
                        documents_per_shard=1)
    return directory


def test_token_ids_beyond_the_vocabulary_are_named_by_file_and_offset(tmp_path):
    directory = _shards_with_a_token_beyond_the_vocabulary(tmp_path / "src", bad_at=300 + 17)
    # at open, in the read that checks the sha256: the second shard, its token 17
    with pytest.raises(DataError, match=r"train-00001\.bin: token 17 \(byte 68\) is id 700, outside the tokenizer's "
                                        r"vocabulary of 512"):
        open_split(directory, "train", expected_tokenizer=IDENTITY)
    # without checksums nothing is read at open: the window read names it instead of an embedding IndexError
    stream = open_split(directory, "train", expected_tokenizer=IDENTITY, verify_checksums=False)
    out = np.empty(64, dtype=np.int64)
    stream.read(0, 64, out)  # the first shard is clean
    with pytest.raises(DataError, match=r"train-00001\.bin: token 17 .* is id 700"):
        stream.read(300, 64, out)


def test_a_shard_truncated_under_a_running_reader_is_named_not_a_sigbus(tmp_path):
    directory = tmp_path / "src"
    tokens = (np.arange(4000) % 500 + 1).astype(np.uint32)
    write_token_dataset(directory, "synthetic", tokens, [4000], tokenizer_identity=IDENTITY)
    # A separate process, so that a SIGBUS (what a memory map gives) would show as its exit status.
    script = f"""
import os, sys
import numpy as np
from data.shards import open_split
from data.errors import DataError
stream = open_split({str(directory)!r}, "train", expected_tokenizer={IDENTITY!r})
out = np.empty(129, dtype=np.int64)
stream.read(3000, 129, out)
os.truncate({str(directory / "train-00000.bin")!r}, 4 * 1000)  # another job rewrites the source
try:
    stream.read(3000, 129, out)
except DataError as error:
    print(error)
    sys.exit(3)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, (result.returncode, result.stderr[-2000:])
    assert "train-00000.bin shrank while this run reads it" in result.stdout
    assert "4000 bytes now, 16000 when the run opened it" in result.stdout


def test_a_loader_over_such_a_shard_raises_the_data_error(tmp_path):
    directory = _shards_with_a_token_beyond_the_vocabulary(tmp_path / "src", bad_at=5)
    stream = open_split(directory, "train", expected_tokenizer=IDENTITY, verify_checksums=False)
    loader = PackedLoader([stream], [1.0], seq_len=32, micro_batch_size=4, dp_rank=0, dp_world_size=1, seed=0)
    with pytest.raises(DataError, match=r"train-00000\.bin: token 5 .* is id 700"):
        for _ in range(10):  # every window of the first shard is drawn within the first epoch's batches
            next(loader)


def test_an_all_nul_text_file_that_gives_no_document_is_counted_and_named(tmp_path, caplog):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    texts = ascii_documents(6, seed=3)
    for index, text in enumerate(texts):
        (corpus / f"doc{index}.txt").write_text(text)
    (corpus / "zeros.txt").write_bytes(b"\0" * 20_000)  # a valid, empty tar archive to datasets
    cfg = files_config(shared_builtin_cache(), corpus, prepared_dir=str(tmp_path / "out"), validation_fraction=0.0)
    with caplog.at_level("WARNING"):
        manifest = prepare_source(cfg, cfg.sources[0], build_tokenizer(cfg), progress=False)
    assert manifest["documents"] == 6
    statistics = manifest["source_statistics"]
    assert statistics["files"] == 7 and statistics["files_without_documents"] == 1
    assert statistics["read_as_archives"] == [str(corpus / "zeros.txt")]
    assert "7 text files gave 6 documents" in caplog.text and "zeros.txt" in caplog.text


@pytest.mark.parametrize("streaming", [False, True])
def test_empty_documents_are_counted_like_undecodable_ones(tmp_path, streaming):
    texts = ascii_documents(20, seed=8)
    texts[4] = texts[11] = ""
    write_jsonl(tmp_path / "c.jsonl", texts)
    cfg = files_config(shared_builtin_cache(), tmp_path / "c.jsonl", prepared_dir=str(tmp_path / "out"),
                       documents_per_shard=8, validation_fraction=0.0, streaming=streaming)
    tokenizer = build_tokenizer(cfg)
    manifest = prepare_source(cfg, cfg.sources[0], tokenizer, progress=False)
    assert manifest["documents"] == 20 and manifest["splits"]["train"]["documents"] == 18
    assert manifest["skipped_documents"] == {"empty": 2}
    record = json.loads((tmp_path / "out" / "local" / "chunk-00001.json").read_text())
    assert record["skipped_documents"] == {"empty": 1} and record["skipped_document_indices"] == [11]
    stream = open_split(tmp_path / "out" / "local", "train", expected_tokenizer=tokenizer.identity)
    assert stream.num_tokens == sum(len(tokenizer.encode(text)) + 1 for text in texts if text)  # no lone EOS


@pytest.mark.parametrize("streaming", [False, True])
def test_a_document_over_the_stated_limit_is_refused_naming_it(tmp_path, streaming):
    texts = ascii_documents(10, seed=2)
    texts[7] = "x" * 5000
    write_jsonl(tmp_path / "c.jsonl", texts)
    cfg = files_config(shared_builtin_cache(), tmp_path / "c.jsonl", prepared_dir=str(tmp_path / "out"),
                       streaming=streaming, max_document_chars=4096)
    with pytest.raises(DataError, match=r"document 7 is 5,000 characters long, over data.max_document_chars=4,096 "
                                        r"\(it begins 'xxxx"):
        prepare_source(cfg, cfg.sources[0], build_tokenizer(cfg), progress=False)
