"""Kind `files`: local JSON lines / JSON, Parquet or text files, or a datasets `save_to_disk` directory.

`path` is a file, a directory (searched recursively; files sorted by path) or a glob. Formats by
extension: .jsonl/.json (also .gz, .zst, .bz2, .xz) -> "json", .parquet -> "parquet", .txt
(also .gz) -> "text" (one document per file by default; `text_sample_by` says paragraph or
line). Files in a directory with other extensions are listed in a warning and not read; an
empty file or a format mix is an error naming the files. A directory written by `datasets`'
save_to_disk is read with load_from_disk, and Megatron .bin/.idx corpora are refused naming
the file (data/sources/saved_datasets.py). A file read as json or text whose first bytes say it
is Parquet (or Arrow) is refused naming it and the file_format to give, rather than failing to
decode as UTF-8.

The description (manifests, cache keys) holds each file's size and modification time, so
editing a file invalidates an automatic cache. Files read one document per file that give no
document (datasets takes an all-NUL .txt for an empty tar archive) are named in a warning and
counted in the manifest's `source_statistics`.
"""

from __future__ import annotations

import glob
import logging
import os
from pathlib import Path
from typing import Optional

from data.config import DataConfig, SourceConfig
from data.decoding import ERROR_HANDLER, is_decode_failure, undecodable_message
from data.errors import DataError
from data.sources.kind import SourceKind, check_documents, hf_cache_dir
from data.sources.saved_datasets import (
    SUPPORTED_FORMATS,
    describe_saved_dataset,
    is_saved_dataset,
    load_saved_dataset,
    refuse_megatron,
)

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


def _saved_dataset(source: SourceConfig) -> Optional[Path]:
    """The source's path when it is a save_to_disk directory, else None."""
    path = Path(os.path.expanduser(source.path or ""))
    return path if is_saved_dataset(path) else None


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
    if file_format in ("json", "text"):
        _refuse_binary_formats(files, file_format, where)
    return files, file_format


BINARY_SIGNATURES = ((b"PAR1", "a Parquet file", "parquet"), (b"ARROW1", "an Arrow IPC file", None))
"""(first bytes, what the file is, the file_format that reads it) of data files that are not text. (Compressed
files and archives are not here: datasets recognizes those by their first bytes and unpacks them.)"""


def _refuse_binary_formats(files: list[Path], file_format: str, where: str) -> None:
    """A file read as json/text whose first bytes say it is a binary format: a DataError naming the file, what it
    is and the file_format to give, instead of a decoding error advising skip_undecodable_documents."""
    for path in files:
        with open(path, "rb") as handle:
            head = handle.read(8)
        for signature, what, fitting in BINARY_SIGNATURES:
            if head.startswith(signature):
                advice = (f"set file_format: {fitting} for this source (or give the file a .{fitting} name with "
                          "file_format: auto)" if fitting else "convert it to jsonl, parquet or text")
                raise DataError(f"{where}: data file {path} is {what} (it begins with {signature!r}), read as "
                                f"file_format={file_format}: {advice}")


def validate(source: SourceConfig, where: str) -> None:
    if not source.path:
        raise ValueError(f"{where}.path must be set for kind='files'")


def describe(source: SourceConfig, cfg: DataConfig) -> dict:
    common = {"kind": source.kind, "split": source.split, "text_field": source.text_field}
    saved = _saved_dataset(source)
    if saved is not None:
        return {**common, **describe_saved_dataset(saved)}
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


def location(source: SourceConfig) -> str:
    return f"files at {source.path}"


def read(source: SourceConfig, cfg: DataConfig):
    import datasets

    saved = _saved_dataset(source)
    if saved is not None:
        where = f"source {source.name!r} (datasets directory {source.path})"
        return check_documents(load_saved_dataset(saved, source.split, source.streaming, where), source, where)
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
            cache_dir=hf_cache_dir(cfg),
            **options,
        )
    except Exception as error:  # datasets raises many types (StopIteration on an empty json, ArrowInvalid...)
        if is_decode_failure(error):
            raise DataError(undecodable_message(where, files, error)) from error
        raise DataError(f"{where}: cannot load as {file_format}: {type(error).__name__}: {error}") from error
    return check_documents(dataset, source, where)


def list_files(source: SourceConfig) -> list[Path]:
    # A save_to_disk directory holds Arrow data, decoded already: nothing to search for undecodable bytes.
    return [] if _saved_dataset(source) is not None else resolve_data_files(source)[0]


def statistics(source: SourceConfig, cfg: DataConfig, documents: int) -> dict | None:
    """Text files read one document per file that gave no document (see the module docstring), or None."""
    if source.text_sample_by != "document" or _saved_dataset(source) is not None:
        return None
    files, file_format = resolve_data_files(source)
    if file_format != "text" or documents >= len(files):
        return None
    from datasets.utils.extract import Extractor

    archives = [str(path) for path in files if not path.name.lower().endswith(".gz")
                and Extractor.infer_extractor_format(str(path))]
    log.warning("source %r: %d text files gave %d documents; datasets reads %s as archives (by their bytes: an "
                "all-NUL file is an empty tar) and finds no text in them: left out, counted in the manifest's "
                "source_statistics", source.name, len(files), documents, archives or "some files")
    return {"files": len(files), "documents": documents, "files_without_documents": len(files) - documents,
            "read_as_archives": archives}


KIND = SourceKind(name="files", validate=validate, describe=describe, location=location, read=read,
                  list_files=list_files, statistics=statistics)
