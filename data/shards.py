"""The token-shard format, and opening a prepared split as one verified token stream.

A prepared source is a directory:

    manifest.json                 written last (atomically): everything below, "complete": true
    train-00000.bin               flat little-endian uint32 tokens; every document ends with EOS
    train-00000.idx.npy           int64 [documents + 1]: offsets of document starts, last = tokens
    validation-00000.bin / .idx.npy
    chunk-00000.json              per-chunk record written when chunk 0's shards are complete
    prepare-settings.json         the settings the partial work was made with (for resuming)

Chunk k holds documents [k * D, (k+1) * D) of the source (D = documents_per_shard); a document
goes to the validation split when ``unit_hash(index, VALIDATION_SALT) < validation_fraction``,
a fixed function of its index, so the split depends on neither the tokenizer nor the order of
processing. A split's token stream is its shards concatenated in chunk order.

Verification on open (`open_split`): the manifest must list each chunk's shards exactly once,
its split totals must equal the sums of its shards, and no unlisted shard file may sit beside
them (`check_manifest_totals`); every shard listed must exist with exactly the size the
manifest gives (a stat per file: catches missing and truncated shards), the index must agree
with the token count, the tokenizer identity must match the configured tokenizer, and (unless
``verify_checksums`` is off) the sha256 of every file is checked once per process, and in the
same read the largest token id of every shard against the tokenizer's vocabulary (an error
names the file and the token's offset). sha256 ran at 0.87 GB/s per core on the development
machine (docs/data.md); the work is split across data-parallel ranks (rank r hashes shards r,
r + w, ...), so a 40 TB corpus (10T tokens) costs each of 1024 ranks ~40 GB of reads, about
45 s at that rate.

Reading: tokens are read with pread(2), not through a memory map. A shard truncated while a run
reads it then gives a short read, reported as a DataError naming the file; through a memory map
the same access is a SIGBUS that kills the process without a word. Every window read is also
checked against the vocabulary (a max over T + 1 ids), so ids beyond it are named by file and
offset even with ``verify_checksums`` off, never an index error deep in the embedding.
`TokenStream.identity` (the manifest path and `content_sha256`) is what checkpoints record of
the corpus.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.errors import DataError
from data.permutation import unit_hash
from fileio.hashing import file_sha256

FORMAT_NAME = "hybrid-nvfp4-token-shards"
FORMAT_VERSION = 1
TOKEN_DTYPE = np.dtype("<u4")
SPLITS = ("train", "validation")
VALIDATION_SALT = 0x5EED_0F_DA7A_5EED
"""Salt of the per-document validation hash (part of the format: changing it changes every split)."""


def is_validation_document(document_indices: np.ndarray, fraction: float) -> np.ndarray:
    """Boolean mask: which documents (by index in their source) are held out for validation."""
    return unit_hash(np.asarray(document_indices, dtype=np.int64), VALIDATION_SALT) < fraction


def shard_file_names(split: str, chunk: int) -> tuple[str, str]:
    """(tokens .bin, document index .idx.npy) file names of one split of one chunk."""
    return f"{split}-{chunk:05d}.bin", f"{split}-{chunk:05d}.idx.npy"


def atomic_write_bytes(path: Path, payload: bytes | memoryview) -> None:
    """Write to a temporary name, fsync, then rename: readers see the whole file or none."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def atomic_write_json(path: Path, value: dict) -> None:
    atomic_write_bytes(path, (json.dumps(value, indent=1, sort_keys=True) + "\n").encode("utf-8"))


def npy_bytes(array: np.ndarray) -> bytes:
    """The .npy serialization of `array` (what np.save writes), as bytes to hash and write at once."""
    import io

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DataError(f"cannot parse {path}: {error}") from error


def read_manifest(directory: Path) -> dict:
    """The manifest of a completely prepared source; a clear error when there is none."""
    path = directory / "manifest.json"
    if not path.is_file():
        state = "does not exist" if not directory.exists() else "holds no manifest.json (preparation incomplete)"
        raise DataError(f"prepared dataset {directory} {state}: run `python -m trainer.prepare_data` "
                        "(or enable data.auto_prepare)")
    manifest = read_json(path)
    if manifest.get("format") != FORMAT_NAME or manifest.get("version") != FORMAT_VERSION:
        raise DataError(
            f"{path}: format {manifest.get('format')!r} version {manifest.get('version')!r}, expected "
            f"{FORMAT_NAME!r} version {FORMAT_VERSION}; prepare the source again"
        )
    if not manifest.get("complete"):
        raise DataError(f"{path} is not marked complete: preparation was interrupted; run it again")
    return manifest


def check_manifest_totals(directory: Path, manifest: dict) -> None:
    """The manifest agrees with itself and the directory: every chunk's shards listed once, split totals equal
    to the sums of their shards, and no shard file present that it does not list. Errors name the shard.

    A removed or duplicated entry would otherwise train on fewer (or repeated) tokens without a word.
    """
    path = directory / "manifest.json"
    documents, per_chunk = int(manifest.get("documents", 0)), manifest.get("documents_per_shard")
    chunks = -(-documents // int(per_chunk)) if per_chunk and documents else 1
    for split in SPLITS:
        entries = [entry for entry in manifest["shards"] if entry["split"] == split]
        listed = [entry["bin"] for entry in entries]
        expected = [shard_file_names(split, chunk)[0] for chunk in range(chunks)]
        for name in sorted(set(listed)):
            if listed.count(name) > 1:
                raise DataError(f"{path} lists shard {directory / name} {listed.count(name)} times")
        for name in expected:
            if name not in listed:
                raise DataError(f"{path} lists no entry for shard {directory / name} (its {documents} documents "
                                f"make {chunks} chunks of {per_chunk}): the entry was removed; prepare the source again")
        for name in listed:
            if name not in expected:
                raise DataError(f"{path} lists shard {directory / name}, beyond its {chunks} chunks")
        on_disk = sorted(found.name for found in directory.glob(f"{split}-*.bin"))
        for name in on_disk:
            if name not in listed:
                raise DataError(f"shard file {directory / name} is not listed in {path} (an entry was removed, or "
                                "the file does not belong here)")
        totals = manifest["splits"][split]
        for key in ("tokens", "documents"):
            summed = sum(int(entry[key]) for entry in entries)
            if int(totals[key]) != summed:
                raise DataError(f"{path}: the {split} split records {totals[key]} {key} but its shards hold {summed}")
    held = sum(int(manifest["splits"][split]["documents"]) for split in SPLITS)
    skipped = sum(int(count) for count in manifest.get("skipped_documents", {}).values())
    if held + skipped != documents:
        raise DataError(f"{path} records {documents} documents but its splits hold {held}"
                        + (f" and {skipped} were skipped" if skipped else ""))


def check_tokenizer_matches(manifest_path: Path, recorded: dict, expected: dict) -> None:
    """Shards are only valid for the exact tokenizer that produced them (name may differ, content may not)."""
    keys = ("sha256", "vocab_size", "eos_id")
    if any(recorded.get(key) != expected.get(key) for key in keys):
        raise DataError(
            f"tokenizer mismatch for {manifest_path}: shards were made with {recorded.get('name')!r} "
            f"(sha256 {str(recorded.get('sha256'))[:12]}, vocab {recorded.get('vocab_size')}, eos {recorded.get('eos_id')}) "
            f"but data.tokenizer is {expected.get('name')!r} (sha256 {str(expected.get('sha256'))[:12]}, "
            f"vocab {expected.get('vocab_size')}, eos {expected.get('eos_id')}); prepare the source again with this tokenizer"
        )


def content_sha256(manifest: dict) -> str:
    """sha256 of what a prepared source holds: its tokenizer and every shard's name, size and sha256 (not the
    preparation time or statistics: preparing the same documents again gives the same hash)."""
    shards = sorted((entry["split"], entry["bin"], entry["tokens"], entry["bin_sha256"], entry["index_sha256"])
                    for entry in manifest["shards"])
    payload = {"tokenizer": manifest.get("tokenizer"), "shards": shards}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _vocabulary_message(path: Path, offset: int, token: int, vocab_size: int, manifest_path: Path) -> str:
    return (f"shard file {path}: token {offset} (byte {offset * TOKEN_DTYPE.itemsize}) is id {token}, outside the "
            f"tokenizer's vocabulary of {vocab_size} ids that {manifest_path} records: these tokens were not made by "
            "that tokenizer; prepare the source again")


def scan_tokens(path: Path) -> tuple[str, int, int]:
    """(sha256, largest token id, offset of its first occurrence) of a token shard, in one read."""
    digest, largest, where, base = hashlib.sha256(), -1, 0, 0
    with open(path, "rb") as handle:
        while block := handle.read(8 << 20):  # a multiple of the token size: blocks hold whole tokens
            digest.update(block)
            tokens = np.frombuffer(block, dtype=TOKEN_DTYPE)
            if tokens.size and int(tokens.max()) > largest:
                largest, where = int(tokens.max()), base + int(tokens.argmax())
            base += tokens.size
    return digest.hexdigest(), largest, where


_verified_lock = threading.Lock()
_verified: dict[tuple[str, int, int], tuple] = {}
"""(path, size, mtime_ns) -> (sha256, largest token id, its offset) of files already read in this process."""


def _verify_checksum(path: Path, expected: str, manifest_path: Path, vocab_size: int | None = None) -> None:
    """The file's sha256 against the manifest's; for a token shard (vocab_size given) also its largest id."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    with _verified_lock:
        known = _verified.get(key)
    if known is None or (vocab_size is not None and known[1] is None):
        known = scan_tokens(path) if vocab_size is not None else (file_sha256(path), None, None)
    actual = known[0]
    if actual != expected:
        raise DataError(
            f"checksum mismatch: {path} has sha256 {actual[:16]}..., {manifest_path} records {expected[:16]}... "
            "(corrupt or modified shard; prepare the source again)"
        )
    if vocab_size is not None and known[1] >= vocab_size:
        raise DataError(_vocabulary_message(path, known[2], known[1], vocab_size, manifest_path))
    with _verified_lock:
        _verified[key] = known


class TokenFile:
    """A shard's tokens, read with pread(2): a file that shrinks under the run is a named error, not a SIGBUS."""

    def __init__(self, path: Path, num_tokens: int):
        self.path, self.num_tokens = path, num_tokens
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    def read(self, start: int, count: int) -> np.ndarray:
        """uint32 [count]: tokens [start, start + count) of the shard."""
        size = TOKEN_DTYPE.itemsize
        tokens = np.empty(count, dtype=TOKEN_DTYPE)
        view, done = memoryview(tokens).cast("B"), 0
        while done < len(view):
            got = os.preadv(self._fd, [view[done:]], start * size + done)  # straight into the array
            if not got:  # end of file before the end of the range: the file shrank
                raise DataError(
                    f"shard file {self.path} shrank while this run reads it: tokens [{start}, {start + count}) lie "
                    f"beyond its end ({os.fstat(self._fd).st_size} bytes now, {self.num_tokens * size} when the run "
                    "opened it). A prepared source must not change under a running job: restore it (or prepare "
                    "it anew elsewhere) and restart; the run resumes from its newest checkpoint"
                )
            done += got
        return tokens

    def __del__(self) -> None:
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            os.close(fd)


@dataclass
class ShardFiles:
    """One shard as the manifest describes it, with its memory maps once opened."""

    tokens_path: Path
    index_path: Path
    num_tokens: int
    num_documents: int
    tokens: TokenFile | None  # read with pread (None for an empty shard)
    offsets: np.ndarray  # int64 [num_documents + 1] (memmap; read for document_ids only)
    index_bytes: int = 0  # the index file's size when opened


class TokenStream:
    """One split of one prepared source: its shards as one contiguous, read-only token stream."""

    def __init__(self, directory: Path, split: str, manifest: dict, shards: list[ShardFiles],
                 vocab_size: int | None = None):
        self.directory = directory
        self.split = split
        self.manifest = manifest
        self.name = manifest["name"]
        # every id read must be below this (None: unchecked); the tokenizer's, as the manifest records it
        self.vocab_size = vocab_size if vocab_size is not None else manifest.get("tokenizer", {}).get("vocab_size")
        self.identity = {"manifest": str(self.manifest_path), "sha256": content_sha256(manifest)}
        self.shards = [shard for shard in shards if shard.num_tokens > 0]
        counts = np.array([shard.num_tokens for shard in self.shards], dtype=np.int64)
        self.shard_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_tokens = int(self.shard_starts[-1])
        self.num_documents = sum(shard.num_documents for shard in self.shards)

    @property
    def manifest_path(self) -> Path:
        return self.directory / "manifest.json"

    def num_windows(self, seq_len: int) -> int:
        """Windows of seq_len + 1 tokens at stride seq_len: window i covers tokens [i T, i T + T + 1)."""
        return max(0, (self.num_tokens - 1) // seq_len)

    def _locate(self, position: int) -> int:
        return int(np.searchsorted(self.shard_starts, position, side="right")) - 1

    def read(self, start: int, length: int, out: np.ndarray) -> None:
        """Copy tokens [start, start + length) of the stream into `out` (any integer dtype), across shards."""
        if start < 0 or start + length > self.num_tokens:
            raise IndexError(f"read [{start}, {start + length}) outside {self.num_tokens} tokens of {self.directory}")
        shard_index, written = self._locate(start), 0
        while written < length:
            shard = self.shards[shard_index]
            local = start + written - int(self.shard_starts[shard_index])
            take = min(length - written, shard.num_tokens - local)
            tokens = shard.tokens.read(local, take)
            if self.vocab_size is not None and take and int(tokens.max()) >= self.vocab_size:
                bad = int(np.argmax(tokens >= self.vocab_size))
                raise DataError(_vocabulary_message(shard.tokens_path, local + bad, int(tokens[bad]), self.vocab_size,
                                                    self.manifest_path))
            out[written : written + take] = tokens
            written += take
            shard_index += 1

    def document_ids(self, start: int, length: int) -> np.ndarray:
        """int64 [length]: for each position, its document's rank among those the range touches (0, 1, ...).

        Shard boundaries are document boundaries (shards hold whole documents).
        """
        boundaries = []  # positions in (start, start + length) where a new document begins
        shard_index, end = self._locate(start), start + length
        while shard_index < len(self.shards) and self.shard_starts[shard_index] < end:
            base = int(self.shard_starts[shard_index])
            shard = self.shards[shard_index]
            if shard.index_path.stat().st_size < shard.index_bytes:  # the memory map below would SIGBUS
                raise DataError(f"document index {shard.index_path} shrank while this run reads it "
                                f"({shard.index_path.stat().st_size} bytes now, {shard.index_bytes} when opened)")
            offsets = shard.offsets
            low = np.searchsorted(offsets, start - base, side="right")
            high = np.searchsorted(offsets, end - base, side="left")
            boundaries.append(np.asarray(offsets[low:high], dtype=np.int64) + base)
            shard_index += 1
        starts = np.unique(np.concatenate(boundaries)) if boundaries else np.empty(0, dtype=np.int64)
        positions = np.arange(start, end, dtype=np.int64)
        return np.searchsorted(starts, positions, side="right").astype(np.int64)


def _open_shard(directory: Path, entry: dict, manifest_path: Path) -> ShardFiles:
    tokens_path, index_path = directory / entry["bin"], directory / entry["index"]
    for path, size_key in ((tokens_path, "bin_bytes"), (index_path, "index_bytes")):
        if not path.is_file():
            raise DataError(f"missing shard file {path} (listed in {manifest_path})")
        size = path.stat().st_size
        if size != entry[size_key]:
            raise DataError(
                f"truncated or resized shard file {path}: {size} bytes, {manifest_path} records {entry[size_key]}"
            )
    num_tokens, num_documents = int(entry["tokens"]), int(entry["documents"])
    if entry["bin_bytes"] != num_tokens * TOKEN_DTYPE.itemsize:
        raise DataError(f"{manifest_path}: entry for {tokens_path.name} gives {num_tokens} tokens but {entry['bin_bytes']} bytes")
    tokens = TokenFile(tokens_path, num_tokens) if num_tokens else None
    try:
        offsets = np.load(index_path, mmap_mode="r", allow_pickle=False)
    except ValueError as error:
        raise DataError(f"cannot read document index {index_path}: {error}") from error
    if offsets.shape != (num_documents + 1,) or offsets.dtype != np.int64:
        raise DataError(
            f"document index {index_path} has shape {offsets.shape} {offsets.dtype}, expected ({num_documents + 1},) int64"
        )
    if int(offsets[0]) != 0 or int(offsets[-1]) != num_tokens:
        raise DataError(f"document index {index_path} spans [{int(offsets[0])}, {int(offsets[-1])}], expected [0, {num_tokens}]")
    return ShardFiles(tokens_path, index_path, num_tokens, num_documents, tokens, offsets, int(entry["index_bytes"]))


def open_split(
    directory: Path,
    split: str,
    *,
    expected_tokenizer: dict | None,
    expected_validation_fraction: float | None = None,
    verify_checksums: bool = True,
    checksum_rank: int = 0,
    checksum_world_size: int = 1,
) -> TokenStream:
    """Open and verify one split of a prepared source (see the module docstring for the checks).

    expected_tokenizer: the configured tokenizer's identity, or None to skip that check (benchmarks).
    checksum_rank / checksum_world_size: this process hashes files checksum_rank, checksum_rank + w, ...
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    directory = Path(directory)
    manifest = read_manifest(directory)
    manifest_path = directory / "manifest.json"
    if expected_tokenizer is not None:
        check_tokenizer_matches(manifest_path, manifest["tokenizer"], expected_tokenizer)
    recorded_fraction = manifest["validation"]["fraction"]
    if expected_validation_fraction is not None and recorded_fraction != expected_validation_fraction:
        raise DataError(
            f"{manifest_path} holds out validation_fraction={recorded_fraction} of documents but "
            f"data.validation_fraction is {expected_validation_fraction}; prepare again or set it to match"
        )
    check_manifest_totals(directory, manifest)
    entries = [entry for entry in manifest["shards"] if entry["split"] == split]
    shards = [_open_shard(directory, entry, manifest_path) for entry in entries]
    vocab_size = (expected_tokenizer or manifest.get("tokenizer") or {}).get("vocab_size")
    if verify_checksums:
        jobs = []
        for number, entry in enumerate(entries):
            if number % checksum_world_size != checksum_rank:
                continue
            jobs.append((directory / entry["bin"], entry["bin_sha256"], vocab_size))
            jobs.append((directory / entry["index"], entry["index_sha256"], None))
        with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
            for future in [pool.submit(_verify_checksum, path, digest, manifest_path, vocab)
                           for path, digest, vocab in jobs]:
                future.result()
    return TokenStream(directory, split, manifest, shards, vocab_size)
