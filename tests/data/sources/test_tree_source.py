"""kind='tree': text files by glob under directory trees, one document per file, deduplicated by content."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from data import DataError, SourceConfig, build_tokenizer, prepare_source
from data.shards import open_split
from data.sources import source_kind
from data.sources.tree import list_tree_files, read_tree
from data_testing import builtin_config, shared_builtin_cache

EOS_TEXT = "<|endoftext|>"


def make_tree(root: Path, seed: int) -> dict[str, str]:
    """A small tree of code and docs with fresh random content; returns relative path -> text of the eligible files."""
    rng = np.random.default_rng(seed)
    words = ["def", "return", "class", "import", "x", "=", "1", "\n", "    ", "# note", "λ", "数据", "(", ")"]
    texts = {}
    for index in range(40):
        suffix = [".py", ".md", ".rst", ".txt"][index % 4]
        relative = f"pkg{index % 3}/sub{index % 2}/file{index}{suffix}"
        texts[relative] = "".join(rng.choice(words, size=int(rng.integers(5, 60)))) + f"\n# {seed}-{index}\n"
    for relative, text in texts.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text, encoding="utf-8")
    return texts


def tree_source(roots, **changes) -> SourceConfig:
    return SourceConfig(name="tree", kind="tree", roots=[str(root) for root in roots], **changes)


def test_listing_order_filters_hidden_excluded_and_overlapping_roots(tmp_path):
    texts = make_tree(tmp_path / "a", seed=1)
    (tmp_path / "a" / ".hidden").mkdir()
    (tmp_path / "a" / ".hidden" / "secret.py").write_text("x = 1\n")
    (tmp_path / "a" / "pkg0" / "binary.so").write_bytes(b"\0\1\2")
    (tmp_path / "a" / "pkg0" / "_vendor").mkdir()
    (tmp_path / "a" / "pkg0" / "_vendor" / "lib.py").write_text("vendored = True\n")
    # The second root lies inside the first: its files are listed once, under the first root.
    files = list_tree_files([str(tmp_path / "a"), str(tmp_path / "a" / "pkg1")], ["*.py", "*.md", "*.rst", "*.txt"],
                            ["*/_vendor/*"], where="test")
    relatives = [file.relative for file in files]
    assert relatives == sorted(texts)
    assert all(file.root == tmp_path / "a" for file in files)


def test_sysconfig_roots_resolve_and_unknown_names_fail(tmp_path):
    files = list_tree_files(["sysconfig:stdlib"], ["abc.py"], [], where="test")
    assert files[0].path == Path(sysconfig.get_paths()["stdlib"]) / "abc.py"
    with pytest.raises(DataError, match="sysconfig:nowhere.*known"):
        list_tree_files(["sysconfig:nowhere"], ["*.py"], [], where="test")
    with pytest.raises(DataError, match="is not a directory"):
        list_tree_files([str(tmp_path / "missing")], ["*.py"], [], where="test")
    with pytest.raises(DataError, match="no file under roots"):
        list_tree_files([str(tmp_path)], ["*.py"], [], where="test")


def test_read_deduplicates_and_counts_what_it_leaves_out(tmp_path):
    texts = make_tree(tmp_path, seed=2)
    first = sorted(texts)[0]
    (tmp_path / "zz_copy.py").write_text(texts[first], encoding="utf-8")  # duplicate, later in order
    (tmp_path / "big.txt").write_text("y" * 5000)
    (tmp_path / "empty.md").write_text("")
    corpus = read_tree(list_tree_files([str(tmp_path)], ["*.py", "*.md", "*.rst", "*.txt"], [], "test"), 4096, False, "test")
    kept = [str(Path(path).relative_to(tmp_path)) for path in corpus.paths]
    assert kept == sorted(texts)
    assert corpus.texts == [texts[relative] for relative in kept]
    stats = corpus.statistics
    assert (stats["duplicates"], stats["too_large"], stats["empty"], stats["kept_files"]) == (1, 1, 1, len(texts))
    assert stats["kept_bytes"] == sum(len(text.encode()) for text in texts.values())
    assert sum(entry["files"] for entry in stats["kept_by_extension"].values()) == len(texts)


def test_undecodable_file_is_named_or_skipped_and_counted(tmp_path):
    make_tree(tmp_path, seed=3)
    bad = tmp_path / "pkg2" / "latin1.txt"
    bad.write_bytes("line one\nline two caf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError) as raised:
        read_tree(list_tree_files([str(tmp_path)], ["*.txt"], [], "test"), 10**6, False, "source 'tree'")
    message = str(raised.value)
    assert str(bad) in message and "line 2" in message and "skip_undecodable" in message
    corpus = read_tree(list_tree_files([str(tmp_path)], ["*.txt"], [], "test"), 10**6, True, "source 'tree'")
    assert corpus.statistics["undecodable"] == 1 and corpus.statistics["undecodable_examples"] == [str(bad)]
    assert str(bad) not in corpus.paths


def test_prepared_tree_round_trips_and_records_statistics(tmp_path):
    texts = make_tree(tmp_path / "tree", seed=4)
    duplicate = tmp_path / "tree" / "pkg9" / "again.py"
    duplicate.parent.mkdir()
    duplicate.write_text(texts[sorted(texts)[3]], encoding="utf-8")
    cfg = builtin_config(shared_builtin_cache(), sources=[tree_source([tmp_path / "tree"])],
                         prepared_dir=str(tmp_path / "prepared"), validation_fraction=0.2, documents_per_shard=16)
    tokenizer = build_tokenizer(cfg)
    manifest = prepare_source(cfg, cfg.sources[0], tokenizer, tmp_path / "prepared" / "tree", progress=False)
    assert manifest["documents"] == len(texts)
    assert manifest["source_statistics"]["duplicates"] == 1
    assert manifest["source"]["files"] == len(texts) + 1
    decoded = []
    for split in ("train", "validation"):
        stream = open_split(tmp_path / "prepared" / "tree", split, expected_tokenizer=tokenizer.identity)
        assert stream.num_documents > 0  # 20% of 40 documents held out: both splits hold some
        for shard in stream.shards:
            tokens = np.fromfile(shard.tokens_path, dtype="<u4")
            offsets = np.load(shard.index_path)
            decoded += [tokenizer.decode(tokens[s : e - 1].tolist()) for s, e in zip(offsets[:-1], offsets[1:])]
    assert sorted(decoded) == sorted(texts.values())


def test_description_changes_when_a_file_changes(tmp_path):
    make_tree(tmp_path, seed=5)
    cfg = builtin_config(shared_builtin_cache(), sources=[tree_source([tmp_path])])
    before = source_kind("tree").describe(cfg.sources[0], cfg)
    target = sorted(tmp_path.rglob("*.md"))[0]
    target.write_text(target.read_text() + "more\n")
    after = source_kind("tree").describe(cfg.sources[0], cfg)
    assert before["listing_sha256"] != after["listing_sha256"]
    assert json.dumps(after)  # JSON-ready: recorded in the manifest and hashed into the cache key
