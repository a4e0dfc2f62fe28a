"""Kind `tree`: text files found by glob under directory trees, one document per file, deduplicated.

For real text with no download: the interpreter's standard library and site-packages hold
hundreds of MB of code and documentation (``.py``, ``.md``, ``.rst``, ``.txt``) on any machine
that runs this project. A source of kind ``tree`` lists

- roots: directories, or ``sysconfig:<name>`` for a path of the running interpreter
  (``sysconfig:stdlib``, ``sysconfig:purelib``, ``sysconfig:platlib``; `sysconfig.get_paths()`);
- include: file-name globs (``*.py``), matched with fnmatch on the file name;
- exclude: globs matched on the path relative to its root (``*/__pycache__/*``, ``*/_vendor/*``).

Rules, deterministic for a given set of files:

- files are listed root by root (in the order given), each root's files sorted by relative
  POSIX path; hidden directories and files (name starting with '.') are not entered; a file
  reached twice (overlapping roots, e.g. site-packages inside the stdlib directory, or a
  symlink) is listed once, under its first path (compared by resolved path);
- a file larger than ``max_document_bytes`` is left out (generated tables, vendored blobs)
  and counted; an empty file is left out and counted;
- exact duplicates (equal sha256 of the bytes) are kept once, at their first path, and
  counted: vendored copies of one library would otherwise be trained on several times per epoch;
- each file is decoded as UTF-8; a file that is not valid UTF-8 stops preparation with an
  error naming the file, the byte offset and the line, unless ``skip_undecodable`` is set,
  which leaves it out and counts it.

The counts (files listed, kept, left out by reason, bytes) are `TreeCorpus.statistics`, which
preparation records in the manifest. `describe_tree` is the cheap stat-only description
(listing digest of paths, sizes and modification times) used as the cache key.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from data.config import DataConfig, SourceConfig
from data.errors import DataError
from data.sources.kind import SourceKind

SYSCONFIG_PREFIX = "sysconfig:"
READ_THREADS = 16
"""Threads reading files (I/O releases the GIL; 16 matches the GPU machine's cores)."""


def resolve_root(root: str, where: str) -> Path:
    """A root directory: a path (``~`` expanded) or ``sysconfig:<name>`` of the running interpreter."""
    if root.startswith(SYSCONFIG_PREFIX):
        name = root[len(SYSCONFIG_PREFIX):]
        paths = sysconfig.get_paths()
        if name not in paths:
            raise DataError(f"{where}: root {root!r} names no sysconfig path; known: {sorted(paths)}")
        path = Path(paths[name])
    else:
        path = Path(root).expanduser()
    if not path.is_dir():
        raise DataError(f"{where}: root {root!r} ({path}) is not a directory")
    return path


@dataclass(frozen=True)
class TreeFile:
    """One listed file: its root, its path relative to the root (POSIX), size and mtime."""

    root: Path
    relative: str
    size: int
    mtime_ns: int

    @property
    def path(self) -> Path:
        return self.root / self.relative


def _matches_any(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def list_tree_files(roots: list[str], include: list[str], exclude: list[str], where: str) -> list[TreeFile]:
    """Every eligible file under the roots, in corpus order (see the module docstring)."""
    if not roots:
        raise DataError(f"{where}: kind 'tree' needs at least one root (sources[i].roots)")
    if not include:
        raise DataError(f"{where}: kind 'tree' needs at least one include glob, e.g. ['*.py', '*.md']")
    seen: set[str] = set()
    listed: list[TreeFile] = []
    for root_name in roots:
        root = resolve_root(root_name, where)
        found = []
        for directory, subdirectories, files in os.walk(root, followlinks=False):
            subdirectories[:] = [name for name in subdirectories if not name.startswith(".")]
            relative_directory = Path(directory).relative_to(root).as_posix()
            for name in files:
                if name.startswith(".") or not _matches_any(name, include):
                    continue
                relative = name if relative_directory == "." else f"{relative_directory}/{name}"
                if exclude and _matches_any(relative, exclude):
                    continue
                found.append(relative)
        for relative in sorted(found):
            path = root / relative
            try:
                stat = path.stat()
                resolved = str(path.resolve())
            except OSError:  # a dangling symlink: nothing to read
                continue
            if not path.is_file() or resolved in seen:
                continue
            seen.add(resolved)
            listed.append(TreeFile(root, relative, stat.st_size, stat.st_mtime_ns))
    if not listed:
        raise DataError(f"{where}: no file under roots {roots} matches include {include} (exclude {exclude})")
    return listed


def describe_tree(files: list[TreeFile], roots: list[str], include: list[str], exclude: list[str],
                  max_document_bytes: int, skip_undecodable: bool, where: str) -> dict:
    """Stat-only description of a listing, for cache keys and manifests: any added, removed or edited file changes it."""
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.path}\0{file.size}\0{file.mtime_ns}\n".encode("utf-8", "surrogateescape"))
    return {
        "kind": "tree",
        "roots": [str(resolve_root(root, where)) for root in roots],
        "include": list(include),
        "exclude": list(exclude),
        "max_document_bytes": max_document_bytes,
        "skip_undecodable": skip_undecodable,
        "files": len(files),
        "bytes": sum(file.size for file in files),
        "listing_sha256": digest.hexdigest(),
    }


@dataclass
class TreeCorpus:
    """The kept documents (texts[i] read from paths[i]) and what was left out, by reason."""

    paths: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    statistics: dict = field(default_factory=dict)


def _line_of(raw: bytes, offset: int) -> int:
    return raw.count(b"\n", 0, offset) + 1


def read_tree(files: list[TreeFile], max_document_bytes: int, skip_undecodable: bool, where: str) -> TreeCorpus:
    """Read, size-filter, deduplicate and decode the listed files (`list_tree_files`; see the module docstring)."""
    corpus = TreeCorpus()
    counts = {"listed_files": len(files), "listed_bytes": sum(f.size for f in files), "too_large": 0, "empty": 0,
              "duplicates": 0, "duplicate_bytes": 0, "undecodable": 0, "kept_files": 0, "kept_bytes": 0}
    undecodable_examples: list[str] = []
    by_extension: dict[str, list[int]] = {}  # suffix -> [kept files, kept bytes]
    candidates = []
    for file in files:
        if file.size > max_document_bytes:
            counts["too_large"] += 1
        elif file.size == 0:
            counts["empty"] += 1
        else:
            candidates.append(file)

    def read(file: TreeFile) -> bytes:
        try:
            return file.path.read_bytes()
        except OSError as error:
            raise DataError(f"{where}: cannot read {file.path}: {error}") from error

    seen_digests: set[bytes] = set()
    with ThreadPoolExecutor(READ_THREADS) as pool:
        for file, raw in zip(candidates, pool.map(read, candidates)):
            digest = hashlib.sha256(raw).digest()
            if digest in seen_digests:
                counts["duplicates"] += 1
                counts["duplicate_bytes"] += len(raw)
                continue
            seen_digests.add(digest)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                if not skip_undecodable:
                    raise DataError(
                        f"{where}: {file.path} is not valid UTF-8 at byte {error.start} (line "
                        f"{_line_of(raw, error.start)}): {error.reason}; set skip_undecodable: true on this "
                        "source to leave such files out (they are counted in the manifest)"
                    ) from error
                counts["undecodable"] += 1
                if len(undecodable_examples) < 10:
                    undecodable_examples.append(str(file.path))
                continue
            corpus.paths.append(str(file.path))
            corpus.texts.append(text)
            counts["kept_files"] += 1
            counts["kept_bytes"] += len(raw)
            kind = by_extension.setdefault(Path(file.relative).suffix or Path(file.relative).name, [0, 0])
            kind[0] += 1
            kind[1] += len(raw)
    if not corpus.texts:
        raise DataError(f"{where}: every listed file was left out ({counts})")
    corpus.statistics = {
        **counts,
        "undecodable_examples": undecodable_examples,
        "kept_by_extension": {suffix: {"files": n, "bytes": b} for suffix, (n, b) in sorted(by_extension.items())},
    }
    return corpus


def _listing(source: SourceConfig) -> tuple[TreeFile, ...]:
    return tuple(list_tree_files(source.roots, source.include, source.exclude, f"source {source.name!r}"))


@lru_cache(maxsize=2)
def _read_cached(files: tuple[TreeFile, ...], max_document_bytes: int, skip_undecodable: bool,
                 where: str) -> TreeCorpus:
    # The listing is the key and holds each file's size and mtime: an edited file is read again.
    return read_tree(list(files), max_document_bytes, skip_undecodable, where)


def _read_source(source: SourceConfig) -> TreeCorpus:
    return _read_cached(_listing(source), source.max_document_bytes, source.skip_undecodable, f"source {source.name!r}")


def validate(source: SourceConfig, where: str) -> None:
    if not source.roots:
        raise ValueError(f"{where}.roots must list at least one directory for kind='tree'")
    if not source.include:
        raise ValueError(f"{where}.include must list at least one file-name glob for kind='tree'")
    if source.max_document_bytes < 1:
        raise ValueError(f"{where}.max_document_bytes must be >= 1, got {source.max_document_bytes}")


def describe(source: SourceConfig, cfg: DataConfig) -> dict:
    description = describe_tree(list(_listing(source)), source.roots, source.include, source.exclude,
                                source.max_document_bytes, source.skip_undecodable, f"source {source.name!r}")
    return {**description, "text_field": source.text_field}


def location(source: SourceConfig) -> str:
    return f"text files {source.include} under {source.roots}"


def read(source: SourceConfig, cfg: DataConfig):
    import datasets

    tree = _read_source(source)
    dataset = datasets.Dataset.from_dict({source.text_field: tree.texts, "path": tree.paths})
    return dataset.to_iterable_dataset() if source.streaming else dataset


def statistics(source: SourceConfig, cfg: DataConfig, documents: int) -> dict:
    return _read_source(source).statistics


KIND = SourceKind(name="tree", validate=validate, describe=describe, location=location, read=read,
                  statistics=statistics)
