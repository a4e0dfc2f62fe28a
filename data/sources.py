"""Text sources as Hugging Face `datasets`: the built-in corpus, local files, Hub datasets.

`load_source` returns a `datasets.Dataset` (indexable: prepared in parallel with
``map(num_proc=...)``) or, with ``streaming: true``, a `datasets.IterableDataset` (read once,
front to back, for corpora larger than disk). `describe_source` is the JSON-ready description
recorded in manifests and hashed into cache keys: for local files it includes each file's size
and modification time, so editing a file invalidates an automatic cache.

Local files: `path` is a file, a directory (searched recursively; files sorted by path) or a
glob. Formats by extension: .jsonl/.json (also .gz, .zst, .bz2, .xz) -> "json", .parquet ->
"parquet", .txt (also .gz) -> "text" (one document per file by default). Files in a directory
with other extensions are listed in a warning and not read; an empty file or a format mix is
an error naming the files. A directory written by `datasets`' save_to_disk is read with
load_from_disk, and Megatron .bin/.idx corpora are refused naming the file
(data/saved_datasets.py).
"""

from __future__ import annotations

import glob
import logging
import os
from pathlib import Path

from functools import lru_cache

from data.builtin import load_builtin_corpus
from data.config import DataConfig, SourceConfig
from data.decoding import ERROR_HANDLER, is_decode_failure, undecodable_message
from data.errors import DataError
from data.saved_datasets import (
    SUPPORTED_FORMATS,
    describe_saved_dataset,
    is_saved_dataset,
    load_saved_dataset,
    refuse_megatron,
)
from data.text_tree import TreeCorpus, TreeFile, describe_tree, list_tree_files, read_tree

log = logging.getLogger(__name__)

_COMPRESSIONS = ("", ".gz", ".zst", ".bz2", ".xz")
FORMAT_BY_EXTENSION = {
    **{f".jsonl{suffix}": "json" for suffix in _COMPRESSIONS},
    **{f".json{suffix}": "json" for suffix in _COMPRESSIONS},
    ".parquet": "parquet",
    ".txt": "text",
    ".txt.gz": "text",
}


def _format_of(path: Path) -> str | None:
    name = path.name.lower()
    for extension in sorted(FORMAT_BY_EXTENSION, key=len, reverse=True):
        if name.endswith(extension):
            return FORMAT_BY_EXTENSION[extension]
    return None


def resolve_data_files(source: SourceConfig) -> tuple[list[Path], str]:
    """(sorted data files, datasets builder name) of a kind='files' source; errors name the path."""
    where = f"source {source.name!r} (path {source.path})"
    raw = os.path.expanduser(source.path or "")
    if any(character in raw for character in "*?["):
        candidates = [Path(match) for match in glob.glob(raw, recursive=True) if Path(match).is_file()]
    elif Path(raw).is_dir():
        candidates = [path for path in Path(raw).rglob("*") if path.is_file() and not path.name.startswith(".")]
    elif Path(raw).is_file():
        candidates = [Path(raw)]
    else:
        raise DataError(f"{where}: no such file or directory")
    candidates = sorted(candidates, key=lambda path: path.as_posix())
    refuse_megatron(candidates, where)
    if Path(raw).is_file() and source.file_format == "auto" and not _format_of(Path(raw)):
        raise DataError(f"{where}: {raw} is not of a supported format; supported: {SUPPORTED_FORMATS}")
    if source.file_format == "auto":
        files = [path for path in candidates if _format_of(path)]
        ignored = [path for path in candidates if not _format_of(path)]
        if ignored:
            log.warning("%s: not reading %d file(s) of unknown format: %s", where, len(ignored), [str(p) for p in ignored[:5]])
        formats = sorted({_format_of(path) for path in files})
        if len(formats) > 1:
            raise DataError(f"{where}: files of several formats {formats}; give one format per source")
        file_format = formats[0] if formats else None
    else:
        files, file_format = candidates, source.file_format
    if not files:
        found = f" (found only {[str(p) for p in candidates[:5]]})" if candidates else ""
        raise DataError(f"{where}: no data files found{found}; supported: {SUPPORTED_FORMATS}")
    for path in files:
        if path.stat().st_size == 0:
            raise DataError(f"{where}: data file {path} is empty")
    return files, file_format


def _tree_listing(source: SourceConfig) -> tuple[TreeFile, ...]:
    return tuple(list_tree_files(source.roots, source.include, source.exclude, f"source {source.name!r}"))


@lru_cache(maxsize=2)
def _read_tree_cached(files: tuple[TreeFile, ...], max_document_bytes: int, skip_undecodable: bool,
                      where: str) -> TreeCorpus:
    # The listing is the key and holds each file's size and mtime: an edited file is read again.
    return read_tree(list(files), max_document_bytes, skip_undecodable, where)


def _read_tree_source(source: SourceConfig) -> TreeCorpus:
    return _read_tree_cached(_tree_listing(source), source.max_document_bytes, source.skip_undecodable,
                             f"source {source.name!r}")


def source_statistics(source: SourceConfig, cfg: DataConfig) -> dict | None:
    """What reading the source kept and left out (kind 'tree'; None for other kinds), for the manifest."""
    if source.kind != "tree":
        return None
    return _read_tree_source(source).statistics


def describe_source(source: SourceConfig, cfg: DataConfig) -> dict:
    """What the source is, for manifests and cache keys (stat-only for local files: cheap)."""
    if source.kind == "builtin":
        return load_builtin_corpus(cfg.builtin_corpus_mb).describe()
    if source.kind == "tree":
        description = describe_tree(list(_tree_listing(source)), source.roots, source.include, source.exclude,
                                    source.max_document_bytes, source.skip_undecodable, f"source {source.name!r}")
        return {**description, "text_field": source.text_field}
    common = {"kind": source.kind, "split": source.split, "text_field": source.text_field}
    if source.kind == "files" and is_saved_dataset(Path(os.path.expanduser(source.path or ""))):
        return {**common, **describe_saved_dataset(Path(os.path.expanduser(source.path)))}
    if source.kind == "files":
        files, file_format = resolve_data_files(source)
        stats = [path.stat() for path in files]
        return {
            **common,
            "format": file_format,
            "text_sample_by": source.text_sample_by if file_format == "text" else None,
            "files": [
                {"path": str(path.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}
                for path, stat in zip(files, stats)
            ],
        }
    return {**common, "hf_name": source.hf_name, "hf_config": source.hf_config}


def load_source(source: SourceConfig, cfg: DataConfig):
    """The source's documents as a datasets Dataset (or IterableDataset when streaming) with `text_field`."""
    import datasets

    cache_dir = str(Path(cfg.cache_dir).expanduser() / "hf_datasets")
    if source.kind == "builtin":
        corpus = load_builtin_corpus(cfg.builtin_corpus_mb)
        dataset = datasets.Dataset.from_dict({source.text_field: list(corpus.texts), "path": list(corpus.relative_paths)})
        return dataset.to_iterable_dataset() if source.streaming else dataset
    if source.kind == "tree":
        tree = _read_tree_source(source)
        dataset = datasets.Dataset.from_dict({source.text_field: tree.texts, "path": tree.paths})
        return dataset.to_iterable_dataset() if source.streaming else dataset
    if source.kind == "files" and is_saved_dataset(Path(os.path.expanduser(source.path or ""))):
        where = f"source {source.name!r} (datasets directory {source.path})"
        dataset = load_saved_dataset(Path(os.path.expanduser(source.path)), source.split, source.streaming, where)
    elif source.kind == "files":
        files, file_format = resolve_data_files(source)
        where = f"source {source.name!r} (files {[str(p) for p in files[:3]]}{'...' if len(files) > 3 else ''})"
        options = {"sample_by": source.text_sample_by} if file_format == "text" else {}
        if cfg.skip_undecodable_documents and file_format in ("json", "text"):
            # "utf_8" (not "utf-8") makes the json builder decode with our handler too (data/decoding.py)
            options.update(encoding="utf_8", encoding_errors=ERROR_HANDLER)
        try:
            dataset = datasets.load_dataset(
                file_format,
                data_files=[str(path) for path in files],
                split="train",
                streaming=source.streaming,
                cache_dir=cache_dir,
                **options,
            )
        except Exception as error:  # datasets raises many types (StopIteration on an empty json, ArrowInvalid...)
            if is_decode_failure(error):
                raise DataError(undecodable_message(where, files, error)) from error
            raise DataError(f"{where}: cannot load as {file_format}: {type(error).__name__}: {error}") from error
    else:
        where = f"source {source.name!r} (Hub dataset {source.hf_name}, config {source.hf_config}, split {source.split})"
        try:
            dataset = datasets.load_dataset(
                source.hf_name, source.hf_config, split=source.split, streaming=source.streaming, cache_dir=cache_dir
            )
        except Exception as error:
            raise DataError(f"{where}: cannot load: {type(error).__name__}: {error}") from error
    columns = dataset.column_names
    if columns is not None and source.text_field not in columns:
        raise DataError(f"{where}: has no text field {source.text_field!r}; its columns are {columns} (set text_field)")
    if not source.streaming and len(dataset) == 0:
        raise DataError(f"{where}: holds no documents")
    return dataset


def source_location(source: SourceConfig) -> str:
    """A short human-readable place for error messages."""
    if source.kind == "files":
        return f"files at {source.path}"
    if source.kind == "hf":
        return f"Hub dataset {source.hf_name}"
    if source.kind == "tree":
        return f"text files {source.include} under {source.roots}"
    return "the built-in corpus"
