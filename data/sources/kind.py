"""What a source kind supplies: how to validate, describe, list, read and count a source of that kind.

Each module of data/sources/ defines one `SourceKind` named `KIND`; data/sources/__init__.py
registers them by name, and preparation (data/prepare.py) and config validation
(data/validate.py) reach a source only through its kind. A kind's functions take the
`SourceConfig` (and, where they need its shared settings, the `DataConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from data.config import DataConfig, SourceConfig
from data.errors import DataError


def no_files(source: SourceConfig) -> list[Path]:
    return []


def no_statistics(source: SourceConfig, cfg: DataConfig, documents: int) -> Optional[dict]:
    return None


@dataclass(frozen=True)
class SourceKind:
    """One kind of text source (the value of `SourceConfig.kind`) and the functions that handle it."""

    name: str
    """The `SourceConfig.kind` value that selects this kind."""
    validate: Callable[[SourceConfig, str], None]
    """Raise a ValueError naming `<where>.<field>` for a setting the kind needs and lacks; runs before any work."""
    describe: Callable[[SourceConfig, DataConfig], dict]
    """JSON-ready description for manifests and the cache key: cheap (stat only for local files), and different
    whenever the documents may be (an edited file changes it), so a stale automatic cache is never reused."""
    location: Callable[[SourceConfig], str]
    """A short place for error messages, e.g. 'files at /data/corpus'."""
    read: Callable[[SourceConfig, DataConfig], Any]
    """The documents as a datasets.Dataset (an IterableDataset when source.streaming) with the `text_field` column
    and, where documents come from files, a 'path' column (named when a document is too long)."""
    list_files: Callable[[SourceConfig], list[Path]] = no_files
    """The local files whose bytes `datasets` decodes as text, in reading order: searched for the first undecodable
    line when preparation fails to decode. Kinds that decode their own text, or read Arrow or the Hub, list none."""
    statistics: Callable[[SourceConfig, DataConfig, int], Optional[dict]] = no_statistics
    """What reading kept and left out (given the documents prepared), recorded as the manifest's
    `source_statistics`; None when there is nothing to say."""


def check_documents(dataset, source: SourceConfig, where: str):
    """`dataset` if it has the source's text column and (unless streamed) a document; else a DataError naming `where`."""
    columns = dataset.column_names
    if columns is not None and source.text_field not in columns:
        raise DataError(f"{where}: has no text field {source.text_field!r}; its columns are {columns} (set text_field)")
    if not source.streaming and len(dataset) == 0:
        raise DataError(f"{where}: holds no documents")
    return dataset


def hf_cache_dir(cfg: DataConfig) -> str:
    """The datasets library's cache under data.cache_dir."""
    return str(Path(cfg.cache_dir).expanduser() / "hf_datasets")
