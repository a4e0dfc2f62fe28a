"""Helpers of the data tests: tiny corpora in temporary directories, never the user's cache."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from data import DataConfig, SourceConfig
from data.prepare import write_token_dataset

SMALL_CORPUS_MB = 0.25
"""Built-in corpus cap in the tests: ~70k tokens, a BPE trains on it in well under a second."""
SMALL_VOCAB = 1024

SYNTHETIC_IDENTITY = {"name": "synthetic", "sha256": "f" * 64, "vocab_size": 1 << 32, "eos_id": 0}


def write_jsonl(path: Path, texts: list[str], field: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for text in texts:
            handle.write(json.dumps({field: text, "id": len(text)}) + "\n")
    return path


def sample_documents(count: int, seed: int) -> list[str]:
    """Varied short documents: ASCII words, digits, unicode, newlines, a literal EOS string."""
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "δέλτα", "ε", "日本語", "emoji🙂", "tab\t", "new\nline", "<|endoftext|>", "42", " "]
    return [" ".join(rng.choice(words, size=int(rng.integers(1, 40)))) + f" #{index}" for index in range(count)]


def ascii_documents(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    words = ["def", "return", "x", "+", "1", "(", ")", ":", "\n", "    ", "class", "import", "os", "value"]
    return ["".join(rng.choice(words, size=int(rng.integers(5, 80)))) + f"# {index}\n" for index in range(count)]


_SHARED_CACHE: list[str] = []


def shared_builtin_cache() -> str:
    """One temporary cache directory per test process: the small builtin tokenizer is trained once."""
    if not _SHARED_CACHE:
        directory = tempfile.mkdtemp(prefix="data_tests_cache_")
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        _SHARED_CACHE.append(directory)
    return _SHARED_CACHE[0]


def builtin_config(cache_dir: str, **changes) -> DataConfig:
    defaults = dict(
        seq_len=64,
        builtin_corpus_mb=SMALL_CORPUS_MB,
        builtin_vocab_size=SMALL_VOCAB,
        cache_dir=cache_dir,
        num_proc=1,
        validation_fraction=0.05,
        validation_batches=2,
    )
    defaults.update(changes)
    return DataConfig(**defaults)


def files_config(cache_dir: str, path: Path, **changes) -> DataConfig:
    """Local files tokenized with the session's small builtin tokenizer."""
    source_keys = ("file_format", "text_field", "streaming", "text_sample_by")
    source_changes = {key: changes.pop(key) for key in source_keys if key in changes}
    source = SourceConfig(name=changes.pop("name", "local"), kind="files", path=str(path), **source_changes)
    return builtin_config(changes.pop("cache_dir", cache_dir), sources=[source], **changes)


def write_synthetic(directory: Path, name: str, lengths: list[int] | np.ndarray, *, base: int = 0, fraction: float = 0.0,
                    documents_per_shard: int = 1 << 62) -> np.ndarray:
    """A prepared source whose token at stream position i is base + i (so windows identify themselves).

    Returns the full token array (train and validation documents, in document order).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    tokens = (base + np.arange(int(lengths.sum()), dtype=np.int64)).astype(np.uint32)
    write_token_dataset(directory, name, tokens, lengths, tokenizer_identity=SYNTHETIC_IDENTITY,
                        validation_fraction=fraction, documents_per_shard=documents_per_shard)
    return tokens


def prepare_small_jsonl_source(tmp_path: Path, seed: int):
    """40 ASCII documents in 3 chunks (a train and a validation shard each) prepared into tmp_path/out/local
    with the session's small builtin tokenizer; returns (config, directory)."""
    from data import build_tokenizer, prepare_source

    write_jsonl(tmp_path / "c.jsonl", ascii_documents(40, seed=seed))
    cfg = files_config(shared_builtin_cache(), tmp_path / "c.jsonl", prepared_dir=str(tmp_path / "out"),
                       documents_per_shard=15, validation_fraction=0.1, seq_len=16, auto_prepare=False)
    prepare_source(cfg, cfg.sources[0], build_tokenizer(cfg), progress=False)
    return cfg, tmp_path / "out" / "local"
