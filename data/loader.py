"""The training loader: packed windows, a seeded sampler sharded over data-parallel ranks, mixing.

Sample space. Dataset d (one prepared source, train split) is a token stream of n_d tokens;
its windows are W_d = (n_d - 1) // T spans of T + 1 tokens at stride T (window i = tokens
[i T, i T + T + 1)): every token but the first is a label once per epoch, except the last
(n_d - 1) mod T < T tokens of the stream, which are never used. inputs = window[:-1], labels = window[1:].

Global sample sequence (identical on every rank, a pure function of seed, weights, T):

- dataset of global sample g: blocks of K = 65536 samples; block b draws K uniforms from
  PCG64(SeedSequence([seed, MIXING_TAG, b])).random_raw (53-bit floats) and maps them through
  the cumulative normalized weights. With one dataset, always 0.
- the j-th sample taken from dataset d (j counts over the whole run) is window
  P_{d,e}(j mod W_d) of epoch e = j // W_d, where P_{d,e} is a Feistel permutation of
  [0, W_d) keyed by (seed, crc32(name of d), e) (data/permutation.py): every epoch visits
  every window once, in a fresh order.

Ranks. A call to `next()` consumes one global batch of G = B * w global samples
[g, g + G); rank r takes g + r, g + r + w, ..., g + r + (B - 1) w (its B rows, in that order).
Ranks never overlap and together cover the sequence. A G that draws more windows from a
dataset than it has (G x its weight share > W_d) is refused by `build_train_loader` (DataError
naming train.micro_batch_size and the source): each window would be repeated within every batch.

State and resume. `state_dict()` = {"global_samples": g, "dataset_samples": {name: j_d},
"seed", "seq_len"}: g is the number of global samples consumed, j_d how many of them came
from dataset d. Every rank holds the same state, so any rank's copy can be saved. After
`load_state_dict`, the loader continues at global sample g, bit-identically. On a different
world size w' (or micro batch B'), it continues the same global sample sequence from g, so
no sample is repeated or skipped; batches are identical to the uninterrupted run's when the
global batch B' w' equals B w (then rank r' of the new run gets g + r' + k w'). Mixing weights
may be changed on resume (later blocks use the new weights; the per-dataset positions j_d
carry over); seed and seq_len may not (the state would point into another sequence).
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import torch

from data.config import DataConfig
from data.errors import DataError
from data.permutation import FeistelPermutation
from data.prepare import ensure_prepared
from data.shards import TokenStream, open_split
from data.tokenizer import build_tokenizer
from data.validate import validate_data_config

MIXING_BLOCK = 65536
"""Global samples per block of mixing choices."""
MIXING_TAG = 0x6D69786E
"""Distinguishes the mixing stream from other uses of the seed."""


class Mixer:
    """Dataset index of each global sample: seeded, i.i.d. with the normalized weights, stable across numpy versions."""

    def __init__(self, weights: list[float], seed: int):
        weights_array = np.asarray(weights, dtype=np.float64)
        self.cumulative = np.cumsum(weights_array / weights_array.sum())
        self.cumulative[-1] = 1.0
        self.seed = seed
        self._block_number = -1
        self._block = np.empty(0, dtype=np.int64)

    def _block_choices(self, block_number: int) -> np.ndarray:
        if block_number != self._block_number:
            generator = np.random.PCG64(np.random.SeedSequence([self.seed, MIXING_TAG, block_number]))
            uniforms = (generator.random_raw(MIXING_BLOCK) >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)
            self._block = np.searchsorted(self.cumulative, uniforms, side="right").astype(np.int64)
            self._block_number = block_number
        return self._block

    def choices(self, start: int, count: int) -> np.ndarray:
        """int64 [count]: dataset of global samples start .. start + count - 1."""
        if len(self.cumulative) == 1:
            return np.zeros(count, dtype=np.int64)
        out = np.empty(count, dtype=np.int64)
        done = 0
        while done < count:
            position = start + done
            block_number, offset = divmod(position, MIXING_BLOCK)
            take = min(count - done, MIXING_BLOCK - offset)
            out[done : done + take] = self._block_choices(block_number)[offset : offset + take]
            done += take
        return out


class WindowSampler:
    """Maps the j-th sample drawn from one dataset to a window start: a fresh permutation every epoch."""

    def __init__(self, stream: TokenStream, seq_len: int, seed: int):
        self.stream = stream
        self.seq_len = seq_len
        self.num_windows = stream.num_windows(seq_len)
        if self.num_windows < 1:
            raise DataError(
                f"seq_len {seq_len} needs {seq_len + 1} tokens per window but the {stream.split} split of "
                f"{stream.manifest_path} has only {stream.num_tokens} tokens; lower data.seq_len or add data"
            )
        self.key_base = [seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF, zlib.crc32(stream.name.encode())]
        self._permutations: dict[int, FeistelPermutation] = {}

    def window_starts(self, draws: np.ndarray) -> np.ndarray:
        """Token offsets of the windows of the given draw numbers (int64 [n])."""
        epochs, positions = np.divmod(draws, self.num_windows)
        windows = np.empty_like(draws)
        for epoch in np.unique(epochs):
            epoch = int(epoch)
            if epoch not in self._permutations:
                if len(self._permutations) > 4:
                    self._permutations.clear()
                self._permutations[epoch] = FeistelPermutation(self.num_windows, self.key_base + [epoch])
            selected = epochs == epoch
            windows[selected] = self._permutations[epoch](positions[selected])
        return windows * self.seq_len


def _make_batch(streams: list[TokenStream], picks: list[tuple[int, int]], seq_len: int, document_ids: bool,
                piece: tuple[int, int] = (0, 1)) -> dict:
    """Read the windows (dataset, token start) into inputs / labels (/ document_ids) [B, T] int64 tensors.

    ``piece`` (index, count): only tokens [index T / count, (index + 1) T / count) of each window, as a
    context-parallel rank trains on them (T / count columns; the labels are still the next tokens)."""
    windows = np.empty((len(picks), seq_len + 1), dtype=np.int64)
    for row, (dataset, start) in enumerate(picks):
        streams[dataset].read(start, seq_len + 1, windows[row])
    index, count = piece
    first, last = index * seq_len // count, (index + 1) * seq_len // count
    batch = {
        "inputs": torch.from_numpy(np.ascontiguousarray(windows[:, first:last])),
        "labels": torch.from_numpy(np.ascontiguousarray(windows[:, first + 1:last + 1])),
    }
    if document_ids:
        ids = np.empty((len(picks), seq_len), dtype=np.int64)
        for row, (dataset, start) in enumerate(picks):
            ids[row] = streams[dataset].document_ids(start, seq_len)
        batch["document_ids"] = torch.from_numpy(np.ascontiguousarray(ids[:, first:last]))
    return batch


def _check_piece(piece: tuple[int, int], seq_len: int) -> tuple[int, int]:
    index, count = piece
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"sequence piece must be (index, count) with 0 <= index < count, got {piece}")
    if seq_len % count:
        raise ValueError(f"data.seq_len ({seq_len}) is not divisible by the context-parallel degree ({count})")
    return int(index), int(count)


class PackedLoader:
    """Infinite iterator of this rank's micro batches; `state_dict` / `load_state_dict` resume exactly."""

    def __init__(
        self,
        streams: list[TokenStream],
        weights: list[float],
        *,
        seq_len: int,
        micro_batch_size: int,
        dp_rank: int,
        dp_world_size: int,
        seed: int,
        document_ids: bool = False,
        sequence_piece: tuple[int, int] = (0, 1),
    ):
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        if not 0 <= dp_rank < dp_world_size:
            raise ValueError(f"dp_rank must be in [0, dp_world_size={dp_world_size}), got {dp_rank}")
        if len(streams) != len(weights) or not streams:
            raise ValueError("one weight per dataset is needed")
        names = [stream.name for stream in streams]
        if len(set(names)) != len(names):
            raise ValueError(f"dataset names must be unique, got {names}")
        self.streams = streams
        self.names = names
        self.seq_len = seq_len
        self.micro_batch_size = micro_batch_size
        self.dp_rank = dp_rank
        self.dp_world_size = dp_world_size
        self.seed = int(seed)
        self.document_ids = document_ids
        self.sequence_piece = _check_piece(sequence_piece, seq_len)
        """(cp rank, cp): the piece of every sequence this rank trains on; the state is the whole group's."""
        self.samplers = [WindowSampler(stream, seq_len, self.seed) for stream in streams]
        self.weights = list(weights)
        self.mixer = Mixer(weights, self.seed)
        self.global_samples = 0
        self.dataset_samples = np.zeros(len(streams), dtype=np.int64)

    def check_batch_fits(self) -> None:
        """Raise DataError when a micro-batch over all ranks draws more windows from a source than it has: each
        window would be trained on several times in one batch (build_train_loader checks; a sampler used for
        statistics may draw so on purpose)."""
        global_batch = self.micro_batch_size * self.dp_world_size
        total = float(sum(self.weights))
        for sampler, weight in zip(self.samplers, self.weights):
            drawn = global_batch * weight / total
            if drawn > sampler.num_windows:
                stream = sampler.stream
                raise DataError(
                    f"train.micro_batch_size={self.micro_batch_size} x {self.dp_world_size} data-parallel rank(s) = "
                    f"{global_batch} sequences per micro-batch draw about {drawn:.0f} windows from source "
                    f"{stream.name!r}, whose train split has only {sampler.num_windows} windows of {self.seq_len + 1} "
                    f"tokens ({stream.num_tokens} tokens, {stream.manifest_path}): every window would be repeated "
                    f"{drawn / sampler.num_windows:.1f} times within each batch. Lower train.micro_batch_size (or "
                    "data.seq_len), or add data")

    def __iter__(self) -> PackedLoader:
        return self

    def __next__(self) -> dict:
        global_batch = self.micro_batch_size * self.dp_world_size
        choices = self.mixer.choices(self.global_samples, global_batch)
        # draw number of each global sample within its dataset: prior count + rank among equal choices
        draws = np.empty(global_batch, dtype=np.int64)
        for dataset in range(len(self.streams)):
            selected = np.flatnonzero(choices == dataset)
            draws[selected] = self.dataset_samples[dataset] + np.arange(selected.size)
        mine = np.arange(self.dp_rank, global_batch, self.dp_world_size)  # this rank's B rows
        my_datasets, my_draws = choices[mine], draws[mine]
        starts = np.empty(mine.size, dtype=np.int64)
        for dataset in np.unique(my_datasets).tolist():
            selected = my_datasets == dataset
            starts[selected] = self.samplers[dataset].window_starts(my_draws[selected])
        picks = list(zip(my_datasets.tolist(), starts.tolist()))
        batch = _make_batch(self.streams, picks, self.seq_len, self.document_ids, self.sequence_piece)
        self.dataset_samples += np.bincount(choices, minlength=len(self.streams))
        self.global_samples += global_batch
        return batch

    def corpus_identity(self) -> dict:
        """{source name: {"manifest": path, "sha256": hash of its shards}}: what a checkpoint records of the
        corpus, so that a resume on other data is noticed (TokenStream.identity)."""
        return {name: dict(stream.identity) for name, stream in zip(self.names, self.streams)}

    def state_dict(self) -> dict:
        """Plain Python values; identical on every rank (see the module docstring for the resume rule)."""
        return {
            "global_samples": int(self.global_samples),
            "dataset_samples": {name: int(count) for name, count in zip(self.names, self.dataset_samples)},
            "seed": self.seed,
            "seq_len": self.seq_len,
        }

    def load_state_dict(self, state: dict) -> None:
        missing = {"global_samples", "dataset_samples", "seed", "seq_len"} - set(state)
        if missing:
            raise ValueError(f"loader state lacks {sorted(missing)}; got keys {sorted(state)}")
        if int(state["seed"]) != self.seed:
            raise ValueError(f"loader state was saved with seed {state['seed']}, this loader uses {self.seed}: not an exact resume")
        if int(state["seq_len"]) != self.seq_len:
            raise ValueError(f"loader state was saved with seq_len {state['seq_len']}, this loader uses {self.seq_len}")
        saved = dict(state["dataset_samples"])
        if set(saved) != set(self.names):
            raise ValueError(f"loader state covers datasets {sorted(saved)}, this loader has {sorted(self.names)}")
        self.global_samples = int(state["global_samples"])
        self.dataset_samples = np.array([int(saved[name]) for name in self.names], dtype=np.int64)


def _open_datasets(cfg: DataConfig, split: str, dp_rank: int, dp_world_size: int) -> list[TokenStream]:
    validate_data_config(cfg)
    tokenizer = build_tokenizer(cfg)
    streams = []
    for source in cfg.sources:
        directory: Path = ensure_prepared(cfg, source, tokenizer)
        streams.append(
            open_split(
                directory,
                split,
                expected_tokenizer=tokenizer.identity,
                expected_validation_fraction=cfg.validation_fraction,
                verify_checksums=cfg.verify_checksums,
                checksum_rank=dp_rank,
                checksum_world_size=dp_world_size,
            )
        )
    return streams


def build_train_loader(
    cfg: DataConfig, *, micro_batch_size: int, dp_rank: int = 0, dp_world_size: int = 1, seed: int | None = None,
    sequence_piece: tuple[int, int] = (0, 1),
) -> PackedLoader:
    """This rank's infinite training iterator over the mixed sources (seed: cfg.seed when None); a
    context-parallel rank reads its ``sequence_piece`` (cp rank, cp) of each sequence."""
    streams = _open_datasets(cfg, "train", dp_rank, dp_world_size)
    loader = PackedLoader(
        streams,
        [source.weight for source in cfg.sources],
        seq_len=cfg.seq_len,
        micro_batch_size=micro_batch_size,
        dp_rank=dp_rank,
        dp_world_size=dp_world_size,
        seed=cfg.seed if seed is None else seed,
        document_ids=cfg.document_ids,
        sequence_piece=sequence_piece,
    )
    loader.check_batch_fits()  # a micro-batch larger than a source would repeat its windows within every batch
    return loader


def _apportion(total: int, weights: list[float]) -> list[int]:
    """Largest-remainder split of `total` into integer shares proportional to `weights`."""
    shares = np.asarray(weights, dtype=np.float64) / float(sum(weights)) * total
    counts = np.floor(shares).astype(np.int64)
    for index in np.argsort(-(shares - counts), kind="stable")[: total - int(counts.sum())]:
        counts[index] += 1
    return counts.tolist()


def validation_windows(streams: list[TokenStream], weights: list[float], seq_len: int, count: int) -> list[tuple[int, int]]:
    """The fixed validation sample list: (dataset, token start), windows taken in order, datasets by weight share."""
    picks = []
    for dataset, (stream, needed) in enumerate(zip(streams, _apportion(count, weights))):
        available = stream.num_windows(seq_len)
        if needed > available:
            raise DataError(
                f"validation split of {stream.manifest_path} has {available} windows of {seq_len + 1} tokens "
                f"({stream.num_tokens} tokens) but {needed} are needed; lower data.validation_batches or the micro "
                "batch, or raise data.validation_fraction and prepare again"
            )
        picks.extend((dataset, window * seq_len) for window in range(needed))
    return picks


def build_validation_batches(cfg: DataConfig, *, micro_batch_size: int, dp_rank: int = 0, dp_world_size: int = 1,
                             sequence_piece: tuple[int, int] = (0, 1)) -> list[dict]:
    """This rank's fixed list of cfg.validation_batches micro batches from the held-out documents.

    Global validation sample i (of validation_batches * B * w) is read by rank i mod w, as batch
    i // (B w); the list is the same on every call, and the global set is the same for any (B, w)
    with equal B w. A context-parallel rank holds its ``sequence_piece`` (cp rank, cp) of each sequence.
    """
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    if not 0 <= dp_rank < dp_world_size:
        raise ValueError(f"dp_rank must be in [0, dp_world_size={dp_world_size}), got {dp_rank}")
    piece = _check_piece(sequence_piece, cfg.seq_len)
    streams = _open_datasets(cfg, "validation", dp_rank, dp_world_size)
    global_batch = micro_batch_size * dp_world_size
    weights = [source.weight for source in cfg.sources]
    picks = validation_windows(streams, weights, cfg.seq_len, cfg.validation_batches * global_batch)
    batches = []
    for batch_number in range(cfg.validation_batches):
        first = batch_number * global_batch
        mine = [picks[first + index] for index in range(dp_rank, global_batch, dp_world_size)]
        batches.append(_make_batch(streams, mine, cfg.seq_len, cfg.document_ids, piece))
    return batches
