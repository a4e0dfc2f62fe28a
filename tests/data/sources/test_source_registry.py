"""The source-kind registry: one lookup, unknown kinds named with the registered ones, and a new kind
added as docs/data.md shows (one module, one entry) prepared end to end."""

from __future__ import annotations

import csv
import dataclasses
import inspect
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import data.sources
from data import DataError, SourceConfig, build_tokenizer, prepare_source, validate_data_config
from data.shards import open_split
from data.sources import SOURCE_KINDS, source_kind
from data.sources.kind import SourceKind
from data_testing import ascii_documents, builtin_config, shared_builtin_cache

ROOT = Path(__file__).resolve().parents[3]
DATA_DOC = ROOT / "docs" / "data.md"


def test_every_kind_is_registered_under_its_own_name_and_documented():
    doc = DATA_DOC.read_text()
    assert list(SOURCE_KINDS) == ["builtin", "files", "tree", "hf"]
    for name, kind in SOURCE_KINDS.items():
        assert isinstance(kind, SourceKind) and kind.name == name
        assert source_kind(name) is kind
        assert f"| `{name}` | `{name}.py` |" in doc, f"docs/data.md's table of kinds lacks {name!r}"
        module = sys.modules[f"data.sources.{name}"]
        assert module.KIND is kind  # one module per kind, its KIND the registered one


INTERFACE = {"validate": ("source", "where"), "describe": ("source", "cfg"), "location": ("source",),
             "read": ("source", "cfg"), "list_files": ("source",), "statistics": ("source", "cfg", "documents")}
"""What SourceKind's docstrings promise each function is called with (by position)."""


def test_every_registered_kind_implements_the_interface():
    assert {field.name for field in dataclasses.fields(SourceKind)} == {"name", *INTERFACE}
    where = "data.sources[0] ('s')"
    for name, kind in SOURCE_KINDS.items():
        for function_name, arguments in INTERFACE.items():
            function = getattr(kind, function_name)
            assert callable(function), f"kind {name!r}: {function_name} is not callable"
            inspect.signature(function).bind(*arguments)  # TypeError if it cannot take these arguments
        bare = SourceConfig(name="s", kind=name)  # only the fields every source has
        try:
            kind.validate(bare, where)
        except ValueError as error:  # a kind that needs a setting names it, under `where`
            assert str(error).startswith(where + ".") and f"kind={name!r}" in str(error), error
        assert isinstance(kind.location(bare), str) and kind.location(bare)


def test_an_unknown_kind_is_refused_naming_the_registered_kinds():
    with pytest.raises(DataError, match=re.escape("unknown source kind 'web'; the registered kinds are "
                                                  "('builtin', 'files', 'tree', 'hf')")):
        source_kind("web")
    config = builtin_config(shared_builtin_cache(), sources=[SourceConfig(name="web", kind="web")])
    with pytest.raises(ValueError, match=re.escape("data.sources[0] ('web').kind must be one of the registered "
                                                   "kinds ('builtin', 'files', 'tree', 'hf'), got 'web'")):
        validate_data_config(config)


def _documented_kind(name: str) -> types.ModuleType:
    """The example kind of docs/data.md, executed as the module `data.sources.<name>` would be."""
    blocks = re.findall(r"^```python\n(.*?)^```", DATA_DOC.read_text(), re.S | re.M)
    (source,) = [block for block in blocks if block.startswith(f'"""Kind `{name}`')]
    module = types.ModuleType(f"data.sources.{name}")
    exec(compile(source, f"docs/data.md (data/sources/{name}.py)", "exec"), module.__dict__)
    return module


def test_a_kind_added_as_the_docs_show_is_validated_prepared_and_read_back(tmp_path, monkeypatch):
    csv_kind = _documented_kind("csv").KIND
    monkeypatch.setitem(data.sources.SOURCE_KINDS, "csv", csv_kind)  # the one entry
    texts = ascii_documents(40, seed=3)
    table = tmp_path / "tables" / "part-0.csv"
    table.parent.mkdir()
    with open(table, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "body"])
        writer.writerows([index, text] for index, text in enumerate(texts))
    source = SourceConfig(name="tables", kind="csv", path=str(tmp_path / "tables" / "*.csv"), text_field="body")
    cfg = builtin_config(shared_builtin_cache(), sources=[source], validation_fraction=0.2)

    validate_data_config(cfg)
    with pytest.raises(ValueError, match=re.escape("data.sources[0] ('tables').path must be set for kind='csv'")):
        validate_data_config(builtin_config(shared_builtin_cache(), sources=[SourceConfig(name="tables", kind="csv")]))

    tokenizer = build_tokenizer(cfg)
    manifest = prepare_source(cfg, source, tokenizer, tmp_path / "prepared", progress=False)
    assert manifest["source"]["kind"] == "csv" and manifest["documents"] == len(texts)
    assert manifest["source"]["files"][0]["path"] == str(table.resolve())
    decoded = []
    for split in ("train", "validation"):
        stream = open_split(tmp_path / "prepared", split, expected_tokenizer=tokenizer.identity)
        for shard in stream.shards:
            tokens = np.fromfile(shard.tokens_path, dtype="<u4")
            offsets = np.load(shard.index_path)
            decoded += [tokenizer.decode(tokens[s : e - 1].tolist()) for s, e in zip(offsets[:-1], offsets[1:])]
    assert sorted(decoded) == sorted(texts)

    empty = SourceConfig(name="none", kind="csv", path=str(tmp_path / "nowhere" / "*.csv"))
    with pytest.raises(DataError, match=re.escape(f"source 'none' (CSV files {empty.path}): no file matches")):
        prepare_source(builtin_config(shared_builtin_cache(), sources=[empty]), empty, tokenizer,
                       tmp_path / "prepared-none", progress=False)
