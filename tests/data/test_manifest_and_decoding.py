"""A manifest whose shards or totals were edited, and source text that is not UTF-8: errors name the shard,
or the file and line; an explicit option drops undecodable documents and counts them."""

from __future__ import annotations

import json
import re

import pytest

from data import DataError, build_train_loader
from data.shards import read_json
from data_testing import ascii_documents, files_config, shared_builtin_cache, prepare_small_jsonl_source


@pytest.fixture
def prepared(tmp_path):
    """40 documents in 3 chunks (train and validation shard each), prepared into tmp_path/out/local."""
    return prepare_small_jsonl_source(tmp_path, seed=5)


def _edit_manifest(directory, edit):
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def _drop_entry(manifest, name, fix_totals):
    entry = next(e for e in manifest["shards"] if e["bin"] == name)
    manifest["shards"].remove(entry)
    if fix_totals:  # the totals edited to match: only the chunk numbering still shows the gap
        manifest["splits"][entry["split"]]["tokens"] -= entry["tokens"]
        manifest["splits"][entry["split"]]["documents"] -= entry["documents"]
        manifest["documents"] -= entry["documents"]


@pytest.mark.parametrize("fix_totals", [False, True])
def test_a_removed_shard_entry_is_named(prepared, fix_totals):
    cfg, directory = prepared
    _edit_manifest(directory, lambda manifest: _drop_entry(manifest, "train-00001.bin", fix_totals))
    with pytest.raises(DataError, match="no entry for shard " + re.escape(str(directory / "train-00001.bin"))):
        build_train_loader(cfg, micro_batch_size=2)


def test_a_removed_last_chunk_is_named_by_its_file_on_disk(prepared):
    cfg, directory = prepared

    def drop_last_chunk(manifest):
        for name in ("train-00002.bin", "validation-00002.bin"):
            _drop_entry(manifest, name, fix_totals=True)

    _edit_manifest(directory, drop_last_chunk)  # 30 documents left: 2 chunks, consistent on paper
    with pytest.raises(DataError, match=re.escape(str(directory / "train-00002.bin")) + " is not listed in"):
        build_train_loader(cfg, micro_batch_size=2)


def test_a_duplicated_entry_and_an_edited_total_are_named(prepared):
    cfg, directory = prepared
    _edit_manifest(directory, lambda manifest: manifest["shards"].append(dict(manifest["shards"][0])))
    with pytest.raises(DataError, match="lists shard " + re.escape(str(directory / "train-00000.bin")) + " 2 times"):
        build_train_loader(cfg, micro_batch_size=2)
    _edit_manifest(directory, lambda manifest: manifest["shards"].pop())
    _edit_manifest(directory, lambda manifest: manifest["splits"]["train"].update(tokens=10**9))
    with pytest.raises(DataError, match=r"train split records 1000000000 tokens but its shards hold \d+"):
        build_train_loader(cfg, micro_batch_size=2)


def _bad_jsonl(path, bad_line):
    lines = [json.dumps({"text": text}).encode() for text in ascii_documents(30, seed=2)]
    lines[bad_line - 1] = b'{"text": "caf\xe9 latin-1, not UTF-8"}'
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.mark.parametrize("streaming", [False, True], ids=["indexed", "streaming"])
def test_undecodable_json_names_file_and_line_or_is_skipped_and_counted(tmp_path, streaming):
    source = _bad_jsonl(tmp_path / "mixed.jsonl", bad_line=18)
    cfg = files_config(shared_builtin_cache(), source, prepared_dir=str(tmp_path / "out"), streaming=streaming,
                       documents_per_shard=20, validation_fraction=0.0, seq_len=16)
    with pytest.raises(DataError, match=re.escape(str(source)) + r" line 18 \(byte \d+\): invalid continuation byte"):
        build_train_loader(cfg, micro_batch_size=2)

    cfg.skip_undecodable_documents = True  # other settings: another prepared directory
    cfg.prepared_dir = str(tmp_path / "skipping")
    build_train_loader(cfg, micro_batch_size=2)
    directory = tmp_path / "skipping" / "local"
    manifest = read_json(directory / "manifest.json")
    assert manifest["skipped_documents"] == {"undecodable": 1}
    assert manifest["documents"] == 30 and manifest["splits"]["train"]["documents"] == 29
    assert read_json(directory / "chunk-00000.json")["skipped_document_indices"] == [17]  # 0-based: line 18


def test_undecodable_text_file_names_file_and_line_or_is_skipped(tmp_path):
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_bytes(b"first document line\nanother line\n")
    (tmp_path / "texts" / "b.txt").write_bytes(b"good line\ngood line\n\xff\xfe bad line\nlast\n")
    cfg = files_config(shared_builtin_cache(), tmp_path / "texts", prepared_dir=str(tmp_path / "out"),
                       text_sample_by="line", validation_fraction=0.0, seq_len=4)
    with pytest.raises(DataError, match=re.escape(str(tmp_path / "texts" / "b.txt")) + r" line 3 \(byte 20\)"):
        build_train_loader(cfg, micro_batch_size=1)
    cfg.skip_undecodable_documents = True
    cfg.prepared_dir = str(tmp_path / "skipping")
    build_train_loader(cfg, micro_batch_size=1)
    manifest = read_json(tmp_path / "skipping" / "local" / "manifest.json")
    assert manifest["skipped_documents"] == {"undecodable": 1}
    assert manifest["splits"]["train"]["documents"] == manifest["documents"] - 1
