"""Kind `builtin`: the Python standard library's source files of the running interpreter.

Real text that ships with every machine that runs this project, so the quickstart needs no
network. Rules (deterministic for a given interpreter):

- files: every ``*.py`` under ``sysconfig.get_paths()["stdlib"]``, sorted by relative path
  (POSIX form), excluding test suites (``test``, ``tests``, ``idle_test`` directories), the
  ``encodings`` codec tables, ``site-packages`` and platform-specific ``_sysconfigdata*`` /
  ``config-*`` files (they differ between machines with the same Python version);
- each file is one document, decoded as UTF-8; a file that is not valid UTF-8 stops with an
  error naming it (none is in CPython's stdlib);
- files are taken in order until adding the next one would pass ``max_mb`` megabytes
  (10**6 bytes) of source; the corpus holds at least one file.

The corpus identity (`BuiltinCorpus.key`) combines the Python version, the cap and a sha256 of
the selected text, so caches built from it are invalidated when any of them change. The builtin
tokenizer (data/tokenizer.py) is trained on the same corpus.
"""

from __future__ import annotations

import hashlib
import platform
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from data.config import DataConfig, SourceConfig
from data.errors import DataError
from data.sources.kind import SourceKind

EXCLUDED_DIRECTORIES = frozenset({"test", "tests", "idle_test", "encodings", "site-packages", "__pycache__"})
"""Directory names whose files are left out of the corpus (test data, codec tables, installed packages)."""


@dataclass(frozen=True)
class BuiltinCorpus:
    """The selected documents: texts[i] is the source of the file at relative_paths[i]."""

    root: str
    relative_paths: tuple[str, ...]
    texts: tuple[str, ...]
    num_bytes: int
    max_mb: float
    content_sha256: str

    @property
    def key(self) -> str:
        """Cache key: Python version, cap, and a short hash of the text itself."""
        return f"py{platform.python_version()}-cap{self.max_mb:g}mb-{self.content_sha256[:12]}"

    def describe(self) -> dict:
        """JSON-ready description recorded in manifests."""
        return {
            "kind": "builtin",
            "python": platform.python_version(),
            "root": self.root,
            "files": len(self.relative_paths),
            "bytes": self.num_bytes,
            "max_mb": self.max_mb,
            "content_sha256": self.content_sha256,
        }


def stdlib_root() -> Path:
    """The running interpreter's standard library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def list_stdlib_sources(root: Path) -> list[Path]:
    """Every eligible .py file under `root`, sorted by relative POSIX path."""
    selected = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        if any(part in EXCLUDED_DIRECTORIES or part.startswith("config-") for part in relative.parts[:-1]):
            continue
        if relative.name.startswith("_sysconfigdata"):
            continue
        if path.is_file():
            selected.append(path)
    return sorted(selected, key=lambda path: path.relative_to(root).as_posix())


@lru_cache(maxsize=4)
def load_builtin_corpus(max_mb: float) -> BuiltinCorpus:
    """Read the corpus (a few MB: ~10 ms from the page cache). Cached per process and cap."""
    if max_mb <= 0:
        raise DataError(f"builtin corpus cap must be > 0 MB, got {max_mb} (data.builtin_corpus_mb)")
    root = stdlib_root()
    paths = list_stdlib_sources(root)
    if not paths:
        raise DataError(f"built-in corpus: no Python source files found under the stdlib directory {root}")
    limit = int(max_mb * 1e6)
    relative_paths, texts, total = [], [], 0
    digest = hashlib.sha256()
    for path in paths:
        raw = path.read_bytes()
        if texts and total + len(raw) > limit:
            break
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DataError(f"built-in corpus: {path} is not valid UTF-8 ({error})") from error
        relative = path.relative_to(root).as_posix()
        # Hash path and text with their lengths so that no two corpora share a digest by concatenation.
        for part in (relative.encode(), raw):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
        relative_paths.append(relative)
        texts.append(text)
        total += len(raw)
    return BuiltinCorpus(
        root=str(root),
        relative_paths=tuple(relative_paths),
        texts=tuple(texts),
        num_bytes=total,
        max_mb=float(max_mb),
        content_sha256=digest.hexdigest(),
    )


def validate(source: SourceConfig, where: str) -> None:
    """Nothing per source: the cap is data.builtin_corpus_mb, checked with the other DataConfig fields."""


def describe(source: SourceConfig, cfg: DataConfig) -> dict:
    return load_builtin_corpus(cfg.builtin_corpus_mb).describe()


def location(source: SourceConfig) -> str:
    return "the built-in corpus"


def read(source: SourceConfig, cfg: DataConfig):
    import datasets

    corpus = load_builtin_corpus(cfg.builtin_corpus_mb)
    dataset = datasets.Dataset.from_dict({source.text_field: list(corpus.texts), "path": list(corpus.relative_paths)})
    return dataset.to_iterable_dataset() if source.streaming else dataset


KIND = SourceKind(name="builtin", validate=validate, describe=describe, location=location, read=read)
