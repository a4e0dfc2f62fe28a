"""The built-in corpus and tokenizers: offline, deterministic, cached, exact round trips."""

from __future__ import annotations

import json
import socket
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

import data.tokenizer as tokenizer_module
from data import DataConfig, DataError, build_tokenizer, build_train_loader, build_validation_batches
from data.sources.builtin import EXCLUDED_DIRECTORIES, load_builtin_corpus
from data.shards import is_validation_document
from data_testing import SMALL_CORPUS_MB, SMALL_VOCAB, builtin_config, shared_builtin_cache


@pytest.fixture
def offline(monkeypatch):
    """Any attempt to open a network connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_corpus_is_the_sorted_stdlib_under_the_cap():
    corpus = load_builtin_corpus(SMALL_CORPUS_MB)
    root = Path(sysconfig.get_paths()["stdlib"])
    assert corpus.root == str(root)
    assert list(corpus.relative_paths) == sorted(corpus.relative_paths)
    assert 0 < corpus.num_bytes <= SMALL_CORPUS_MB * 1e6
    assert all(not set(Path(path).parts[:-1]) & EXCLUDED_DIRECTORIES for path in corpus.relative_paths)
    # each document is the file's text, read from the interpreter's own stdlib
    for relative, text in list(zip(corpus.relative_paths, corpus.texts))[:20]:
        assert (root / relative).read_text(encoding="utf-8") == text
    larger = load_builtin_corpus(2 * SMALL_CORPUS_MB)
    assert larger.relative_paths[: len(corpus.relative_paths)] == corpus.relative_paths  # a prefix: sorted order
    assert larger.key != corpus.key and len(larger.texts) > len(corpus.texts)


def test_builtin_tokenizer_trains_offline_round_trips_and_is_cached(offline, tmp_path, monkeypatch):
    cfg = builtin_config(str(tmp_path))
    tokenizer = build_tokenizer(cfg)
    assert tokenizer.vocab_size <= SMALL_VOCAB and tokenizer.vocab_size > 256
    assert tokenizer.decode([tokenizer.eos_id]) == "<|endoftext|>"
    corpus = load_builtin_corpus(SMALL_CORPUS_MB)
    for text in corpus.texts[:5] + ("héllo wörld 日本語 🙂\r\n\ttabs", ""):
        assert tokenizer.decode(tokenizer.encode(text)) == text
    # a literal EOS string inside a document is text, not the EOS token
    ids = tokenizer.encode("a <|endoftext|> b")
    assert tokenizer.eos_id not in ids and tokenizer.decode(ids) == "a <|endoftext|> b"
    assert tokenizer.encode_batch(["x = 1", "y"]) == [tokenizer.encode("x = 1"), tokenizer.encode("y")]
    # second build in a fresh process state: read from the cache, no training
    tokenizer_module._build_cached.cache_clear()
    monkeypatch.setattr(tokenizer_module, "train_byte_level_bpe", lambda *a, **k: pytest.fail("retrained"))
    again = build_tokenizer(cfg)
    assert again.identity == tokenizer.identity
    # and the identity tells tokenizers apart
    tokenizer_module._build_cached.cache_clear()
    monkeypatch.undo()
    other = build_tokenizer(builtin_config(str(tmp_path), builtin_vocab_size=SMALL_VOCAB // 2))
    assert other.sha256 != tokenizer.sha256


def test_local_tokenizer_files_load_with_the_same_identity(tmp_path):
    from transformers import PreTrainedTokenizerFast

    builtin = build_tokenizer(builtin_config(shared_builtin_cache()))
    file = tmp_path / "tok" / "tokenizer.json"
    file.parent.mkdir()
    builtin.save(file)
    from_file = build_tokenizer(DataConfig(tokenizer=str(file), cache_dir=str(tmp_path)))
    assert from_file.sha256 == builtin.sha256 and from_file.eos_id == builtin.eos_id
    # a Hugging Face directory whose tokenizer_config.json names the EOS
    (file.parent / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|endoftext|>"}}))
    from_directory = build_tokenizer(DataConfig(tokenizer=str(file.parent), cache_dir=str(tmp_path)))
    assert from_directory.identity["sha256"] == builtin.sha256
    text = "def f(x):\n    return x ** 2  # ünïcode"
    # transformers reading the same file (an independent consumer) encodes identically
    reference = PreTrainedTokenizerFast(tokenizer_file=str(file))
    assert reference(text, add_special_tokens=False)["input_ids"] == from_directory.encode(text)


def test_local_tokenizer_errors_name_the_path(tmp_path):
    with pytest.raises(DataError, match="does-not-exist"):
        build_tokenizer(DataConfig(tokenizer=str(tmp_path / "does-not-exist"), cache_dir=str(tmp_path)))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DataError, match="bad.json"):
        build_tokenizer(DataConfig(tokenizer=str(bad), cache_dir=str(tmp_path)))
    good = tmp_path / "noeos" / "tokenizer.json"
    good.parent.mkdir()
    build_tokenizer(builtin_config(shared_builtin_cache())).save(good)
    with pytest.raises(DataError, match="no EOS token"):
        build_tokenizer(DataConfig(tokenizer=str(good), eos_token="<nope>", cache_dir=str(tmp_path)))


def test_builtin_end_to_end_offline(offline):
    cfg = builtin_config(shared_builtin_cache())
    tokenizer = build_tokenizer(cfg)
    loader = build_train_loader(cfg, micro_batch_size=4, seed=3)
    batch = next(loader)
    assert batch["inputs"].shape == batch["labels"].shape == (4, cfg.seq_len)
    assert batch["inputs"].dtype == torch.int64
    assert int(batch["inputs"].max()) < tokenizer.vocab_size and int(batch["inputs"].min()) >= 0
    assert torch.equal(batch["inputs"][:, 1:], batch["labels"][:, :-1])
    text = tokenizer.decode(batch["inputs"][0].tolist())
    corpus = "<|endoftext|>".join(load_builtin_corpus(SMALL_CORPUS_MB).texts)
    assert text[5:-5] in corpus  # a window is a piece of the stdlib text stream (ends may split a character)
    validation = build_validation_batches(cfg, micro_batch_size=4)
    assert len(validation) == cfg.validation_batches
    again = build_validation_batches(cfg, micro_batch_size=4)
    assert all(torch.equal(a["inputs"], b["inputs"]) for a, b in zip(validation, again))
    # validation windows are pieces of the held-out documents' text stream
    texts = load_builtin_corpus(SMALL_CORPUS_MB).texts
    held_out = is_validation_document(np.arange(len(texts)), cfg.validation_fraction)
    assert 0 < held_out.sum() < len(texts)
    held_out_text = "".join(text + "<|endoftext|>" for text, keep in zip(texts, held_out) if keep)
    for batch in validation:
        for row in batch["inputs"]:
            assert tokenizer.decode(row.tolist())[5:-5] in held_out_text
