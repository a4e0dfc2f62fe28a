"""Preparation: source documents -> tokenized, checksummed token shards (format in data/shards.py).

The source is processed in chunks of D = documents_per_shard documents. For chunk k:

1. tokenize documents [k D, (k+1) D): indexable sources with ``datasets.map(batched=True,
   num_proc=...)``, streaming sources with the tokenizer's batch encoder (Rust threads);
   EOS is appended to every document. A document that is empty (after decoding) gets no tokens,
   not even the EOS, and neither does an undecodable one when data.skip_undecodable_documents:
   they keep their index and are counted by reason (`skipped_documents` in the chunk record and
   the manifest, and a warning). A document longer than data.max_document_chars stops
   preparation naming it: the tokenizer holds ~200 bytes of memory per character of one document;
2. split them by document into train / validation (`is_validation_document`);
3. write train-k and validation-k shards (tokens .bin, offsets .idx.npy) by temp file + fsync +
   rename, hash them, then write chunk-k.json. A chunk whose record exists and whose files still
   match their sha256 is not redone, so an interrupted run resumes where it stopped.

The source is reached through its kind (data/sources/): `describe` goes into the settings and
the manifest, `read` gives the documents, `statistics` what reading left out (the manifest's
`source_statistics`: a tree's duplicates and oversize files, text files datasets read as
archives), and `list_files` the files searched for the place of an undecodable byte.

manifest.json is written last and marks the directory complete. `prepare_source` holds a file
lock (``<directory>.lock``) while it prepares, so concurrent processes (the ranks of a run, a
second `python -m trainer.prepare_data` into the same --out, a run starting while the script prepares)
prepare a source once: the others wait, then verify and use the result. Work that was started
with other settings (tokenizer, source files, hold-out, chunk size: prepare-settings.json) is
refused, never mixed in.

A complete directory named by data.prepared_dir is used only if it holds this source: its
manifest's source description must match the configured one (`check_prepared_source`: the kind,
and per kind what the source is: file names and sizes, the built-in corpus's content hash, the
Hub name, the tree's roots and globs; not modification times or absolute paths, so a corpus
copied or mounted elsewhere still matches). A directory of another source is refused naming
both, never trained on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

import numpy as np
from filelock import FileLock, Timeout
from tqdm.auto import tqdm

from data.config import DataConfig, SourceConfig
from data.decoding import UNDECODABLE_MARK, is_decode_failure, undecodable_message
from data.errors import DataError
from data.shards import (
    FORMAT_NAME,
    FORMAT_VERSION,
    TOKEN_DTYPE,
    atomic_write_bytes,
    atomic_write_json,
    check_tokenizer_matches,
    is_validation_document,
    npy_bytes,
    read_json,
    read_manifest,
    shard_file_names,
)
from data.sources import source_kind
from data.tokenizer import Tokenizer
from fileio.hashing import file_sha256

log = logging.getLogger(__name__)

MAP_BATCH_SIZE = 256
"""Documents per datasets.map batch (one encode_batch call)."""
SKIP_REASONS = {1: "undecodable", 2: "empty"}
"""Why a document gets no tokens (tokenize_batch's "skipped" column; 0: kept)."""


def preparation_settings(cfg: DataConfig, source: SourceConfig, tokenizer: Tokenizer) -> dict:
    """Everything the shards depend on; equal settings give byte-identical shards (streaming or not)."""
    settings = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "name": source.name,
        "source": source_kind(source.kind).describe(source, cfg),
        "tokenizer": tokenizer.identity,
        "validation_fraction": cfg.validation_fraction,
        "documents_per_shard": cfg.documents_per_shard,
    }
    if cfg.skip_undecodable_documents:  # only when set: caches of clean runs keep their keys
        settings["skip_undecodable_documents"] = True
    return settings


def prepared_directory(cfg: DataConfig, source: SourceConfig, tokenizer: Tokenizer) -> Path:
    """<prepared_dir>/<name> when prepared_dir is set, else <cache_dir>/prepared/<name>-<hash of the settings>."""
    if cfg.prepared_dir:
        return Path(cfg.prepared_dir).expanduser() / source.name
    settings = preparation_settings(cfg, source, tokenizer)
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cfg.cache_dir).expanduser() / "prepared" / f"{source.name}-{key}"


def _where(source: SourceConfig) -> str:
    """The source as error messages name it: "source 'web' (files at /data/web)"."""
    return f"source {source.name!r} ({source_kind(source.kind).location(source)})"


def _chunk_record_path(directory: Path, chunk: int) -> Path:
    return directory / f"chunk-{chunk:05d}.json"


def _completed_chunk(directory: Path, chunk: int, first_document: int, documents: int | None) -> dict | None:
    """The chunk's record if its shards are complete and intact; None (redo it) otherwise."""
    path = _chunk_record_path(directory, chunk)
    if not path.is_file():
        return None
    record = read_json(path)
    if record["first_document"] != first_document or (documents is not None and record["documents"] != documents):
        log.warning("%s covers other documents than expected: redoing chunk %d", path, chunk)
        return None
    for entry in record["shards"]:
        for name, size_key, digest_key in (("bin", "bin_bytes", "bin_sha256"), ("index", "index_bytes", "index_sha256")):
            file = directory / entry[name]
            if not file.is_file() or file.stat().st_size != entry[size_key] or file_sha256(file) != entry[digest_key]:
                log.warning("%s is missing or does not match %s: redoing chunk %d", file, path, chunk)
                return None
    return record


def _write_chunk(
    directory: Path, chunk: int, first_document: int, tokens: np.ndarray, lengths: np.ndarray, fraction: float,
    skipped: np.ndarray | None = None,
) -> dict:
    """Split one tokenized chunk by document into train / validation shards; write them and the chunk record.

    tokens: uint32 [sum(lengths)], documents back to back, each ending with EOS; lengths: int64 [documents].
    skipped: uint8 [documents], why a document got no tokens (SKIP_REASONS; 0: kept); skipped ones keep
    their index (so the validation split of the others does not move) and are counted in the record.
    """
    document_indices = np.arange(first_document, first_document + len(lengths), dtype=np.int64)
    held_out = is_validation_document(document_indices, fraction)
    token_held_out = np.repeat(held_out, lengths)
    skipped = np.zeros(len(lengths), dtype=np.uint8) if skipped is None else np.asarray(skipped, dtype=np.uint8)
    kept = skipped == 0
    entries = []
    for split, document_mask, token_mask in (
        ("train", ~held_out & kept, ~token_held_out),
        ("validation", held_out & kept, token_held_out),
    ):
        split_tokens = np.ascontiguousarray(tokens[token_mask], dtype=TOKEN_DTYPE)
        offsets = np.zeros(int(document_mask.sum()) + 1, dtype=np.int64)
        np.cumsum(lengths[document_mask], out=offsets[1:])
        index_payload = npy_bytes(offsets)
        bin_name, index_name = shard_file_names(split, chunk)
        atomic_write_bytes(directory / bin_name, memoryview(split_tokens).cast("B"))
        atomic_write_bytes(directory / index_name, index_payload)
        entries.append(
            {
                "split": split,
                "bin": bin_name,
                "index": index_name,
                "tokens": int(split_tokens.size),
                "documents": int(document_mask.sum()),
                "bin_bytes": int(split_tokens.nbytes),
                "index_bytes": len(index_payload),
                "bin_sha256": hashlib.sha256(memoryview(split_tokens).cast("B")).hexdigest(),
                "index_sha256": hashlib.sha256(index_payload).hexdigest(),
            }
        )
    record = {"chunk": chunk, "first_document": first_document, "documents": int(len(lengths)), "shards": entries}
    if not kept.all():
        record["skipped_documents"] = {reason: int((skipped == code).sum()) for code, reason in SKIP_REASONS.items()
                                       if (skipped == code).any()}
        record["skipped_document_indices"] = document_indices[~kept].tolist()
        log.warning("chunk %d of %s: skipped %s documents (indices %s...)", chunk, directory,
                    record["skipped_documents"], record["skipped_document_indices"][:5])
    atomic_write_json(_chunk_record_path(directory, chunk), record)
    return record


def tokenize_batch(
    batch: dict, indices: list[int], *, tokenizer: Tokenizer, text_field: str, first_document: int, where: str,
    skip_undecodable: bool = False, max_document_chars: int | None = None,
) -> dict:
    """datasets.map function: each document's token ids followed by EOS (runs in worker processes), and
    "skipped": why a document got no tokens at all, not even EOS (SKIP_REASONS; 0: kept).

    An empty document is skipped; with skip_undecodable, so is one holding UNDECODABLE_MARK (data/decoding.py).
    A kept document longer than max_document_chars stops preparation with a DataError naming it.
    """
    texts = batch[text_field]
    for text, index in zip(texts, indices):
        if not isinstance(text, str):
            raise DataError(
                f"{where}: document {first_document + index} has no text in field {text_field!r} "
                f"(got {type(text).__name__})"
            )
    skipped = [1 if skip_undecodable and UNDECODABLE_MARK in text else 2 if not text else 0 for text in texts]
    if max_document_chars is not None:
        for row, (text, index, reason) in enumerate(zip(texts, indices, skipped)):
            if not reason and len(text) > max_document_chars:
                raise DataError(_too_long_message(where, first_document + index, text, batch, row, max_document_chars))
    encoded = tokenizer.encode_batch(["" if reason else text for text, reason in zip(texts, skipped)])
    return {"input_ids": [[] if reason else ids + [tokenizer.eos_id] for ids, reason in zip(encoded, skipped)],
            "skipped": skipped}


def _too_long_message(where: str, document: int, text: str, batch: dict, row: int, limit: int) -> str:
    path = batch.get("path", [None] * (row + 1))[row]  # builtin and tree sources carry each document's file
    return (f"{where}: document {document}{f' ({path})' if path else ''} is {len(text):,d} characters long, over "
            f"data.max_document_chars={limit:,d} (it begins {text[:60]!r}). Tokenizing one document holds about 200 "
            "bytes of memory per character (10 GB for 50 M characters); raise the limit knowingly, split such "
            "documents (text_sample_by: line or paragraph for text files), or remove them")


def _flatten_token_lists(column) -> tuple[np.ndarray, np.ndarray]:
    """Arrow list<uint32> column (chunked) -> (uint32 tokens back to back, int64 lengths)."""
    values, lengths = [], []
    for piece in column.chunks:
        values.append(piece.flatten().to_numpy(zero_copy_only=False))
        lengths.append(piece.value_lengths().to_numpy(zero_copy_only=False))
    if not values:
        return np.empty(0, dtype=TOKEN_DTYPE), np.empty(0, dtype=np.int64)
    return np.concatenate(values).astype(TOKEN_DTYPE, copy=False), np.concatenate(lengths).astype(np.int64)


def _tokenize_options(cfg: DataConfig) -> dict:
    return {"skip_undecodable": cfg.skip_undecodable_documents, "max_document_chars": cfg.max_document_chars}


def _tokenize_indexed(
    dataset, first: int, end: int, *, tokenizer: Tokenizer, source: SourceConfig, num_proc: int, scratch: Path, chunk: int,
    skip_undecodable: bool = False, max_document_chars: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Documents [first, end) of an indexable dataset -> (uint32 tokens with EOS after each, int64 lengths,
    uint8 skip reasons)."""
    import datasets

    part = dataset.select(range(first, end))
    processes = max(1, min(num_proc, end - first))
    scratch.mkdir(parents=True, exist_ok=True)
    mapped = part.map(
        tokenize_batch,
        batched=True,
        batch_size=MAP_BATCH_SIZE,
        with_indices=True,
        num_proc=processes if processes > 1 else None,
        fn_kwargs={
            "tokenizer": tokenizer,
            "text_field": source.text_field,
            "first_document": first,
            "where": _where(source),
            "skip_undecodable": skip_undecodable,
            "max_document_chars": max_document_chars,
        },
        remove_columns=part.column_names,
        features=datasets.Features({"input_ids": datasets.Sequence(datasets.Value("uint32")),
                                    "skipped": datasets.Value("uint8")}),
        cache_file_name=str(scratch / f"chunk-{chunk:05d}.arrow"),
        load_from_cache_file=False,
        new_fingerprint=hashlib.sha256(f"{scratch}/{chunk}/{time.time_ns()}".encode()).hexdigest()[:16],
        desc=f"tokenizing {source.name} chunk {chunk}",
    )
    tokens, lengths = _flatten_token_lists(mapped.data.column("input_ids"))
    skipped = mapped.data.column("skipped").to_numpy().astype(np.uint8)
    del mapped
    shutil.rmtree(scratch, ignore_errors=True)
    return tokens, lengths, skipped


def _tokenize_texts(texts: list, *, tokenizer: Tokenizer, source: SourceConfig, first_document: int,
                    skip_undecodable: bool = False, max_document_chars: int | None = None):
    """Like _tokenize_indexed for a list of texts (a streaming source's chunk)."""
    where = _where(source)
    pieces, skipped = [], []
    for start in range(0, len(texts), 4096):
        batch = texts[start : start + 4096]
        out = tokenize_batch({"text": batch}, list(range(start, start + len(batch))), tokenizer=tokenizer,
                             text_field="text", first_document=first_document, where=where,
                             skip_undecodable=skip_undecodable, max_document_chars=max_document_chars)
        pieces.extend(out["input_ids"])
        skipped.extend(out["skipped"])
    lengths = np.fromiter((len(ids) for ids in pieces), dtype=np.int64, count=len(pieces))
    tokens = np.fromiter((token for ids in pieces for token in ids), dtype=TOKEN_DTYPE, count=int(lengths.sum()))
    return tokens, lengths, np.asarray(skipped, dtype=np.uint8)


def _prepare_indexed(dataset, directory, cfg, source, tokenizer, num_proc, progress) -> list[dict]:
    per_chunk = cfg.documents_per_shard
    total = len(dataset)
    num_chunks = -(-total // per_chunk)
    records = []
    with tqdm(total=num_chunks, desc=f"preparing {source.name}", unit="shard", disable=not progress) as bar:
        for chunk in range(num_chunks):
            first, end = chunk * per_chunk, min(total, (chunk + 1) * per_chunk)
            record = _completed_chunk(directory, chunk, first, end - first)
            if record is None:
                tokens, lengths, skipped = _tokenize_indexed(
                    dataset, first, end, tokenizer=tokenizer, source=source, num_proc=num_proc,
                    scratch=directory / "tmp", chunk=chunk, **_tokenize_options(cfg),
                )
                record = _write_chunk(directory, chunk, first, tokens, lengths, cfg.validation_fraction, skipped)
            records.append(record)
            bar.update()
    return records


def _prepare_streaming(dataset, directory, cfg, source, tokenizer, progress) -> list[dict]:
    per_chunk = cfg.documents_per_shard
    records = []
    # Completed chunks form a prefix of the stream; a short chunk can only be the last one.
    while (record := _completed_chunk(directory, len(records), len(records) * per_chunk, None)) is not None:
        records.append(record)
        if record["documents"] < per_chunk:
            return records
    chunk = len(records)
    stream = dataset.skip(chunk * per_chunk) if chunk else dataset
    buffer: list = []
    with tqdm(desc=f"preparing {source.name} (stream)", unit="doc", initial=chunk * per_chunk, disable=not progress) as bar:
        for example in stream:
            buffer.append(example.get(source.text_field) if isinstance(example, dict) else None)
            if len(buffer) == per_chunk:
                tokens, lengths, skipped = _tokenize_texts(buffer, tokenizer=tokenizer, source=source,
                                                           first_document=chunk * per_chunk, **_tokenize_options(cfg))
                records.append(_write_chunk(directory, chunk, chunk * per_chunk, tokens, lengths, cfg.validation_fraction,
                                            skipped))
                bar.update(len(buffer))
                chunk, buffer = chunk + 1, []
        if buffer:
            tokens, lengths, skipped = _tokenize_texts(buffer, tokenizer=tokenizer, source=source,
                                                       first_document=chunk * per_chunk, **_tokenize_options(cfg))
            records.append(_write_chunk(directory, chunk, chunk * per_chunk, tokens, lengths, cfg.validation_fraction,
                                        skipped))
            bar.update(len(buffer))
    return records


@contextlib.contextmanager
def _datasets_progress(enabled: bool):
    import datasets

    was_enabled = datasets.is_progress_bar_enabled()
    (datasets.enable_progress_bars if enabled else datasets.disable_progress_bars)()
    try:
        yield
    finally:
        (datasets.enable_progress_bars if was_enabled else datasets.disable_progress_bars)()


def _check_settings(path: Path, settings: dict) -> None:
    previous = read_json(path)
    if previous != settings:
        differing = sorted(key for key in set(previous) | set(settings) if previous.get(key) != settings.get(key))
        raise DataError(
            f"{path.parent} holds work prepared with other settings ({', '.join(differing)} differ, see {path}); "
            "delete that directory or point data.prepared_dir elsewhere"
        )


@contextlib.contextmanager
def preparation_lock(directory: Path):
    """Hold ``<directory>.lock`` (an OS file lock, released when the process ends however it ends): one
    process prepares a directory at a time; the others wait here, saying so."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(directory) + ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.warning("another process is preparing %s (lock %s): waiting for it to finish, then using its work",
                    directory, lock.lock_file)
        while True:
            try:
                lock.acquire(timeout=60)
                break
            except Timeout:
                log.warning("still waiting for another process to finish preparing %s (lock %s)", directory,
                            lock.lock_file)
    try:
        yield
    finally:
        lock.release()


def prepare_source(
    cfg: DataConfig,
    source: SourceConfig,
    tokenizer: Tokenizer,
    directory: Path | None = None,
    *,
    progress: bool = True,
    lock: bool = True,
) -> dict:
    """Prepare (or finish preparing) one source into `directory`; returns its manifest.

    Locked (`preparation_lock`): a concurrent preparation of the same directory waits, then finds it
    complete, checks it and returns its manifest. lock=False: the caller holds the lock already."""
    directory = Path(directory) if directory is not None else prepared_directory(cfg, source, tokenizer)
    if not lock:
        return _prepare_source_locked(cfg, source, tokenizer, directory, progress)
    with preparation_lock(directory):
        return _prepare_source_locked(cfg, source, tokenizer, directory, progress)


def _prepare_source_locked(cfg: DataConfig, source: SourceConfig, tokenizer: Tokenizer, directory: Path,
                           progress: bool) -> dict:
    kind = source_kind(source.kind)
    settings = preparation_settings(cfg, source, tokenizer)
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "manifest.json").is_file():
        manifest = read_manifest(directory)
        check_tokenizer_matches(directory / "manifest.json", manifest["tokenizer"], tokenizer.identity)
        if (directory / "prepare-settings.json").is_file():
            _check_settings(directory / "prepare-settings.json", settings)
        return manifest
    settings_path = directory / "prepare-settings.json"
    if settings_path.is_file():
        _check_settings(settings_path, settings)
    else:
        atomic_write_json(settings_path, settings)
    num_proc = cfg.num_proc or os.cpu_count() or 1
    started = time.perf_counter()
    with _datasets_progress(progress):
        dataset = kind.read(source, cfg)
        try:
            if source.streaming:
                records = _prepare_streaming(dataset, directory, cfg, source, tokenizer, progress)
            else:
                records = _prepare_indexed(dataset, directory, cfg, source, tokenizer, num_proc, progress)
        except Exception as error:  # json bytes reach Python (and fail to decode) only at tokenization
            if isinstance(error, DataError) or not is_decode_failure(error):
                raise
            raise DataError(undecodable_message(_where(source), kind.list_files(source), error)) from error
    if sum(record["documents"] for record in records) == 0:
        raise DataError(f"{_where(source)} holds no documents")
    manifest = _assemble_manifest(
        source.name, settings["source"], tokenizer.identity, cfg.validation_fraction, cfg.documents_per_shard,
        records, time.perf_counter() - started,
    )
    statistics = kind.statistics(source, cfg, manifest["documents"])
    if statistics is not None:  # what reading kept and left out (duplicates, oversize, undecodable or archive files)
        manifest["source_statistics"] = statistics
    atomic_write_json(directory / "manifest.json", manifest)
    log.info("prepared %s into %s: %s", source.name, directory, manifest["splits"])
    return manifest


def _assemble_manifest(
    name: str, source: dict, tokenizer_identity: dict, fraction: float, per_chunk: int, records: list[dict], seconds: float
) -> dict:
    shards = [entry for record in records for entry in record["shards"]]
    skipped: dict[str, int] = {}
    for record in records:
        for reason, count in record.get("skipped_documents", {}).items():
            skipped[reason] = skipped.get(reason, 0) + int(count)
    splits = {
        split: {
            "tokens": sum(entry["tokens"] for entry in shards if entry["split"] == split),
            "documents": sum(entry["documents"] for entry in shards if entry["split"] == split),
        }
        for split in ("train", "validation")
    }
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "name": name,
        "source": source,
        "tokenizer": tokenizer_identity,
        "dtype": TOKEN_DTYPE.str,
        "validation": {
            "fraction": fraction,
            "rule": "document i is held out when unit_hash(i, VALIDATION_SALT) < fraction (data/shards.py)",
        },
        "documents_per_shard": per_chunk,
        "documents": sum(record["documents"] for record in records),
        "splits": splits,
        "shards": shards,
        "seconds": round(seconds, 3),
        "complete": True,
        **({"skipped_documents": skipped} if skipped else {}),
    }


def write_token_dataset(
    directory: Path,
    name: str,
    tokens: np.ndarray,
    lengths: np.ndarray,
    *,
    tokenizer_identity: dict,
    validation_fraction: float = 0.0,
    documents_per_shard: int = 1 << 62,
    source: dict | None = None,
) -> dict:
    """Write already-tokenized documents (tokens back to back, EOS included) as a prepared source.

    For synthetic data (benchmarks, tests): the same shard files, checksums and manifest as
    prepare_source, without a tokenizer run. Returns the manifest.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokens = np.asarray(tokens, dtype=TOKEN_DTYPE)
    lengths = np.asarray(lengths, dtype=np.int64)
    if int(lengths.sum()) != tokens.size:
        raise ValueError(f"lengths sum to {int(lengths.sum())} but {tokens.size} tokens were given")
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    records = []
    for chunk, first in enumerate(range(0, max(1, len(lengths)), documents_per_shard)):
        end = min(len(lengths), first + documents_per_shard)
        records.append(
            _write_chunk(directory, chunk, first, tokens[offsets[first] : offsets[end]], lengths[first:end], validation_fraction)
        )
    manifest = _assemble_manifest(
        name, source or {"kind": "synthetic"}, tokenizer_identity, validation_fraction, documents_per_shard, records, 0.0
    )
    atomic_write_json(directory / "manifest.json", manifest)
    return manifest


def ensure_prepared(cfg: DataConfig, source: SourceConfig, tokenizer: Tokenizer, *, progress: bool = True) -> Path:
    """The source's prepared directory, preparing it first (once, under a file lock) if allowed.

    A complete directory under data.prepared_dir must hold this source (`check_prepared_source`)."""
    directory = prepared_directory(cfg, source, tokenizer)
    if not (directory / "manifest.json").is_file():
        if not cfg.auto_prepare:
            raise DataError(
                f"source {source.name!r}: no prepared shards at {directory} and data.auto_prepare is false; "
                "run `python -m trainer.prepare_data` with this data config first"
            )
        with preparation_lock(directory):  # another process preparing it: wait, then use its work
            if not (directory / "manifest.json").is_file():
                prepare_source(cfg, source, tokenizer, directory, progress=progress, lock=False)
    if cfg.prepared_dir:  # the cache's directory names hash the settings: only a pinned one can hold another source
        check_prepared_source(directory, cfg, source)
    return directory


IGNORED_IN_SOURCE_COMPARISON = frozenset({"mtime_ns", "listing_sha256", "python", "root"})
"""Description keys that change without the source changing: modification times (and the tree's listing hash
over them), the interpreter's version and stdlib path (the built-in corpus's content hash decides)."""


def _comparable(description):
    """A source description without what may change while the source stays the same (file paths by name)."""
    if isinstance(description, dict):
        kept = {key: _comparable(value) for key, value in description.items() if key not in IGNORED_IN_SOURCE_COMPARISON}
        if "path" in kept and isinstance(kept["path"], str) and description.get("bytes") is not None:
            kept["path"] = Path(kept["path"]).name  # the same files copied or mounted elsewhere
        return kept
    if isinstance(description, list):
        return [_comparable(value) for value in description]
    return description


def _shown(value, limit: int = 160) -> str:
    if isinstance(value, list) and value and isinstance(value[0], dict) and "path" in value[0]:
        value = [entry["path"] for entry in value]  # a file list: its names say it
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + "..."


def check_prepared_source(directory: Path, cfg: DataConfig, source: SourceConfig) -> None:
    """Raise DataError when the complete prepared `directory` holds another source than `source`.

    Compares the manifest's source description with the configured source's, without modification times
    or absolute paths. Where the configured source cannot be described on this machine (the raw files of a
    corpus prepared elsewhere are not here), the kind and a configured file's name are still compared.
    Shards written by `write_token_dataset` (kind 'synthetic') are the tools' own and are not compared."""
    manifest_path = Path(directory) / "manifest.json"
    recorded = read_json(manifest_path).get("source") or {}
    if recorded.get("kind") == "synthetic":
        return
    where = f"data.prepared_dir: {directory} holds shards of another source than {_where(source)}"
    advice = ("point data.prepared_dir at this source's shards, or prepare this source into another directory "
              "(`python -m trainer.prepare_data` with this data config and another --out)")
    if recorded.get("kind") != source.kind:
        raise DataError(f"{where}: they were prepared from a {recorded.get('kind')!r} source ({manifest_path}), this "
                        f"one is {source.kind!r}; {advice}")
    try:
        current = source_kind(source.kind).describe(source, cfg)
    except (DataError, OSError) as error:  # the raw source is not on this machine: shards prepared elsewhere
        named = Path(os.path.expanduser(source.path or "")).name if source.kind == "files" else ""
        recorded_names = {Path(entry.get("path", "")).name for entry in recorded.get("files", [])
                          if isinstance(entry, dict)}
        if named and recorded_names and "." in named and not any(c in named for c in "*?[") \
                and named not in recorded_names:
            raise DataError(f"{where}: they were prepared from {sorted(recorded_names)[:5]}, this source reads "
                            f"{source.path} ({error}); {advice}") from None
        log.info("%s: cannot describe the source here (%s); using the prepared shards as they are", source.name, error)
        return
    before, now = _comparable(recorded), _comparable(current)
    differing = sorted(key for key in set(before) | set(now) if before.get(key) != now.get(key))
    if differing:
        details = "; ".join(f"{key}: prepared {_shown(before.get(key))}, configured {_shown(now.get(key))}"
                            for key in differing[:4])
        raise DataError(f"{where} ({manifest_path}): {details}; {advice}")
