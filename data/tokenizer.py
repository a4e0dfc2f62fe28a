"""Tokenizers: the builtin byte-level BPE, or any `tokenizers` / `transformers` tokenizer on disk.

Everything is wrapped in one `Tokenizer` class over a `tokenizers.Tokenizer` (the Rust library
that `transformers`' fast tokenizers run on), so preparation and tests see one interface.

- Documents are encoded without added special tokens (no BOS) and with special-token matching
  off (`encode_special_tokens = True`): a literal "<|endoftext|>" inside a document's text is
  encoded as ordinary text, so only the EOS the preparer appends separates documents.
- Identity: ``{"name", "sha256", "vocab_size", "eos_id"}``, where sha256 hashes the tokenizer's
  canonical JSON (`tokenizers.Tokenizer.to_str()`). Manifests record it; the loader refuses
  shards whose identity differs from the configured tokenizer's.
- The builtin tokenizer is a byte-level BPE (GPT-2 style pre-tokenization, no normalizer, so
  decode(encode(text)) == text for any text) with one special token, EOS ``<|endoftext|>``,
  trained with `tokenizers.trainers.BpeTrainer` on the built-in corpus. It is cached under
  ``<cache_dir>/tokenizers/<key>/tokenizer.json`` (key: vocab size + corpus key) and trained
  under a file lock, so concurrent processes train it once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from functools import lru_cache
from pathlib import Path
from typing import Iterable

import tokenizers
from filelock import FileLock
from tokenizers import decoders, models, pre_tokenizers, trainers

from data.config import DataConfig
from data.errors import DataError
from data.sources.builtin import load_builtin_corpus

log = logging.getLogger(__name__)

BUILTIN_EOS = "<|endoftext|>"
"""The builtin tokenizer's only special token: appended after each document."""

KNOWN_EOS_TOKENS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")
"""Names tried, in order, when neither data.eos_token nor tokenizer_config.json names the EOS."""


class Tokenizer:
    """A `tokenizers.Tokenizer` with an EOS id and a stable identity.

    Picklable (datasets.map ships it to worker processes); the special-token setting that
    `tokenizers` does not serialize is restored on unpickling.
    """

    def __init__(self, backend: tokenizers.Tokenizer, *, name: str, eos_id: int, path: str | None = None):
        self.backend = backend
        self.name = name
        self.eos_id = int(eos_id)
        self.path = path  # the tokenizer.json file or tokenizer directory it was read from
        self.vocab_size = int(backend.get_vocab_size(with_added_tokens=True))
        if not 0 <= self.eos_id < self.vocab_size:
            raise DataError(f"tokenizer {name!r}: EOS id {eos_id} is outside its vocabulary of {self.vocab_size}")
        # Hash before changing runtime flags; to_str() is canonical (vocab and merges in id order).
        self.sha256 = hashlib.sha256(backend.to_str().encode("utf-8")).hexdigest()
        self.backend.encode_special_tokens = True

    @property
    def identity(self) -> dict:
        """What manifests record; two tokenizers with equal identities encode identically."""
        return {"name": self.name, "sha256": self.sha256, "vocab_size": self.vocab_size, "eos_id": self.eos_id}

    @property
    def record(self) -> dict:
        """What checkpoints and run_info.json record: the identity, the EOS token and where it was read from."""
        return {**self.identity, "eos_token": self.backend.id_to_token(self.eos_id), "path": self.path}

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return [encoding.ids for encoding in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Inverse of encode; special tokens (EOS) are kept as their text."""
        return self.backend.decode(list(ids), skip_special_tokens=False)

    def save(self, path: str | os.PathLike) -> None:
        """Write the tokenizer as a tokenizer.json that `build_tokenizer` (or transformers) can load."""
        Path(path).write_text(self.backend.to_str(), encoding="utf-8")

    def __getstate__(self) -> dict:
        return {"json": self.backend.to_str(), "name": self.name, "eos_id": self.eos_id, "path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(tokenizers.Tokenizer.from_str(state["json"]), name=state["name"], eos_id=state["eos_id"],
                      path=state.get("path"))

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id}, sha256={self.sha256[:12]})"


def train_byte_level_bpe(texts: Iterable[str], vocab_size: int) -> tokenizers.Tokenizer:
    """A byte-level BPE with EOS as its only special token (id 0), trained on `texts`."""
    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BUILTIN_EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    return backend


def builtin_tokenizer_path(cfg: DataConfig) -> Path:
    """Where the builtin tokenizer for this config lives (trained there on first use)."""
    corpus = load_builtin_corpus(cfg.builtin_corpus_mb)
    key = f"builtin-bpe-v{cfg.builtin_vocab_size}-{corpus.key}"
    return Path(cfg.cache_dir).expanduser() / "tokenizers" / key / "tokenizer.json"


def _load_or_train_builtin(cfg: DataConfig) -> Tokenizer:
    path = builtin_tokenizer_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.parent) + ".lock"):
        if not path.exists():
            corpus = load_builtin_corpus(cfg.builtin_corpus_mb)
            log.info("training the builtin BPE (vocab %d) on %d stdlib files", cfg.builtin_vocab_size, len(corpus.texts))
            backend = train_byte_level_bpe(corpus.texts, cfg.builtin_vocab_size)
            temporary = path.with_suffix(".json.tmp")
            temporary.write_text(backend.to_str(), encoding="utf-8")
            os.replace(temporary, path)
    backend = _read_tokenizer_json(path)
    eos_id = backend.token_to_id(BUILTIN_EOS)
    if eos_id is None:
        raise DataError(f"builtin tokenizer {path} has no {BUILTIN_EOS} token: delete the file to retrain it")
    return Tokenizer(backend, name=f"builtin-bpe-v{cfg.builtin_vocab_size}", eos_id=eos_id, path=str(path))


TOKENIZER_JSON_KEYS = ("model", "pre_tokenizer", "decoder", "added_tokens")
"""Top-level keys of a `tokenizers` tokenizer.json ("model" holds the vocabulary)."""


def _read_tokenizer_json(path: Path) -> tokenizers.Tokenizer:
    """The tokenizer in a tokenizer.json; DataError naming the file and what it is instead when it is not one
    (the Rust library's own words, "expected `,` or `}` at line 1 column 14", name neither)."""
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as error:  # the Rust library raises a bare Exception on bad JSON
        raise DataError(f"data.tokenizer: {path} {_what_it_is_instead(path)}; expected a tokenizer.json as the "
                        f"`tokenizers` library (or transformers' save_pretrained) writes it: a JSON object with "
                        f"\"model\" (its vocabulary) and usually {', '.join(repr(k) for k in TOKENIZER_JSON_KEYS[1:])}, "
                        f"or a tokenizer directory (the library said: {error})") from error


def _what_it_is_instead(path: Path) -> str:
    try:
        content = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        return f"is not JSON ({error})"
    except OSError as error:
        return f"cannot be read ({error})"
    if not isinstance(content, dict):
        return f"is JSON but not an object (a {type(content).__name__})"
    if "model" not in content:
        keys = ", ".join(repr(key) for key in list(content)[:6]) + (", ..." if len(content) > 6 else "")
        known = (" (a model's config.json?)" if "model_type" in content or "architectures" in content
                 else " (a tokenizer_config.json?)" if "tokenizer_class" in content else "")
        return f"is JSON with the keys {keys}{known} but not a tokenizer: it has no \"model\""
    return "is a tokenizer.json the library cannot read (damaged or of a newer version)"


def _eos_from_tokenizer_config(directory: Path) -> str | None:
    config_path = directory / "tokenizer_config.json"
    if not config_path.is_file():
        return None
    try:
        eos = json.loads(config_path.read_text(encoding="utf-8")).get("eos_token")
    except json.JSONDecodeError as error:
        raise DataError(f"cannot parse {config_path}: {error}") from error
    if isinstance(eos, dict):  # older transformers write AddedToken dicts
        eos = eos.get("content")
    return eos if isinstance(eos, str) else None


def _load_local(cfg: DataConfig) -> Tokenizer:
    path = Path(cfg.tokenizer).expanduser()
    if not path.exists():
        raise DataError(
            f"tokenizer path {path} does not exist (data.tokenizer): give 'builtin', a tokenizer.json file or a "
            "local Hugging Face tokenizer directory (Hub names are not downloaded here)"
        )
    directory = path if path.is_dir() else path.parent
    if path.is_file():
        backend = _read_tokenizer_json(path)
    elif (path / "tokenizer.json").is_file():
        backend = _read_tokenizer_json(path / "tokenizer.json")
    else:
        # A slow (e.g. sentencepiece-only) tokenizer directory: transformers converts it to a fast one.
        from transformers import AutoTokenizer

        try:
            fast = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as error:
            raise DataError(f"cannot load a tokenizer from directory {path}: {error}") from error
        backend = getattr(fast, "backend_tokenizer", None) or getattr(fast, "_tokenizer", None)
        if backend is None:
            raise DataError(f"tokenizer in {path} has no fast (tokenizers) backend; save it with tokenizer.json")
    eos_token = cfg.eos_token or _eos_from_tokenizer_config(directory)
    candidates = [eos_token] if eos_token else list(KNOWN_EOS_TOKENS)
    for candidate in candidates:
        eos_id = backend.token_to_id(candidate)
        if eos_id is not None:
            return Tokenizer(backend, name=path.name if path.is_dir() else path.parent.name or path.name, eos_id=eos_id,
                             path=str(path.resolve()))
    raise DataError(
        f"tokenizer {path}: no EOS token found (tried {candidates}); set data.eos_token to one of its special tokens"
    )


@lru_cache(maxsize=8)
def _build_cached(tokenizer: str, eos_token: str | None, vocab_size: int, corpus_mb: float, cache_dir: str) -> Tokenizer:
    cfg = DataConfig(
        tokenizer=tokenizer,
        eos_token=eos_token,
        builtin_vocab_size=vocab_size,
        builtin_corpus_mb=corpus_mb,
        cache_dir=cache_dir,
    )
    if tokenizer == "builtin":
        return _load_or_train_builtin(cfg)
    return _load_local(cfg)


def build_tokenizer(cfg: DataConfig) -> Tokenizer:
    """The configured tokenizer (cached per process: building a 131k-entry one takes ~0.5 s)."""
    return _build_cached(cfg.tokenizer, cfg.eos_token, cfg.builtin_vocab_size, float(cfg.builtin_corpus_mb), cfg.cache_dir)
