"""Text sources, one module per kind, behind one lookup: `source_kind(source.kind)`.

    kind = source_kind(source.kind)      # a SourceKind (data/sources/kind.py)
    kind.validate(source, "data.sources[0] ('web')")   # ValueError naming the field
    kind.describe(source, cfg)           # JSON for the manifest and the cache key
    dataset = kind.read(source, cfg)     # datasets.Dataset (IterableDataset when streaming)

| kind | module | reads |
|---|---|---|
| builtin | builtin.py | the running interpreter's stdlib sources (the quickstart's corpus) |
| files | files.py | local JSON lines / JSON, Parquet, text files, or a save_to_disk directory |
| tree | tree.py | text files by glob under directory trees, one document per file, deduplicated |
| hf | hf.py | a Hugging Face Hub dataset by name |

A new kind is one module defining `KIND = SourceKind(...)` and one entry in SOURCE_KINDS below
(docs/data.md shows one); settings no existing `SourceConfig` field covers become fields there.
"""

from __future__ import annotations

from data.errors import DataError
from data.sources import builtin, files, hf, tree
from data.sources.kind import SourceKind

SOURCE_KINDS: dict[str, SourceKind] = {kind.name: kind for kind in (builtin.KIND, files.KIND, tree.KIND, hf.KIND)}
"""Every source kind by the name a SourceConfig gives as `kind`."""


def source_kind(name: str) -> SourceKind:
    """The registered kind called `name`; a DataError listing the registered kinds if there is none."""
    try:
        return SOURCE_KINDS[name]
    except KeyError:
        raise DataError(f"unknown source kind {name!r}; the registered kinds are {tuple(SOURCE_KINDS)} "
                        "(data/sources/)") from None


__all__ = ["SOURCE_KINDS", "SourceKind", "source_kind"]
