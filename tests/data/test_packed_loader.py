"""The packed loader on synthetic shards: windows, rank sharding, epochs, mixing, resume, document ids."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from data.loader import PackedLoader, validation_windows
from data.shards import open_split
from data_testing import write_synthetic


def open_train(directory):
    return open_split(directory, "train", expected_tokenizer=None)


def make_loader(streams, weights=None, **options) -> PackedLoader:
    settings = dict(seq_len=16, micro_batch_size=4, dp_rank=0, dp_world_size=1, seed=7)
    settings.update(options)
    return PackedLoader(streams, weights or [1.0] * len(streams), **settings)


@pytest.fixture
def single(tmp_path):
    """One dataset of 1003 tokens in 3 shards (documents of random lengths): 62 windows at T = 16."""
    lengths = np.random.default_rng(1).integers(1, 40, size=100)
    lengths = lengths[: np.searchsorted(np.cumsum(lengths), 1003) + 1]
    lengths[-1] -= lengths.sum() - 1003
    tokens = write_synthetic(tmp_path / "single", "single", lengths, documents_per_shard=25)
    return open_train(tmp_path / "single"), tokens, lengths


def test_windows_are_consecutive_tokens_with_labels_shifted(single):
    stream, tokens, _ = single
    assert len(stream.shards) == 3  # windows cross shard boundaries
    loader = make_loader([stream])
    batch = next(loader)
    assert batch["inputs"].dtype == torch.int64 and batch["inputs"].shape == (4, 16)
    assert set(batch) == {"inputs", "labels"}
    for inputs, labels in zip(batch["inputs"], batch["labels"]):
        start = int(inputs[0])  # token value = stream position
        assert start % 16 == 0
        np.testing.assert_array_equal(inputs.numpy(), tokens[start : start + 16])
        np.testing.assert_array_equal(labels.numpy(), tokens[start + 1 : start + 17])


def test_one_epoch_visits_every_window_once_and_the_next_epoch_reshuffles(single):
    stream, tokens, _ = single
    windows = (len(tokens) - 1) // 16
    loader = make_loader([stream], micro_batch_size=windows)
    first = next(loader)["inputs"][:, 0].numpy()
    second = next(loader)["inputs"][:, 0].numpy()
    expected = np.arange(windows) * 16
    np.testing.assert_array_equal(np.sort(first), expected)
    np.testing.assert_array_equal(np.sort(second), expected)
    assert not np.array_equal(first, second)
    assert not np.array_equal(first, expected)  # shuffled, not in stream order


def test_two_ranks_are_disjoint_and_cover_an_epoch(single):
    stream, tokens, _ = single
    windows = (len(tokens) - 1) // 16  # 62 = 31 steps of a global batch of 2 x 1
    seen = {}
    for rank in range(2):
        loader = make_loader([stream], micro_batch_size=1, dp_rank=rank, dp_world_size=2)
        seen[rank] = [int(next(loader)["inputs"][0, 0]) for _ in range(windows // 2)]
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(0, windows * 16, 16))
    # and the ranks interleave the single-rank sequence: rank r holds global samples r, r + 2, ...
    whole = make_loader([stream], micro_batch_size=windows)
    sequence = next(whole)["inputs"][:, 0].tolist()
    assert sequence[0::2] == seen[0] and sequence[1::2] == seen[1]


def test_resume_is_bit_identical(single):
    stream, _, _ = single
    reference = make_loader([stream], micro_batch_size=3)
    for _ in range(25):  # crosses an epoch boundary (62 windows)
        next(reference)
    state = json.loads(json.dumps(reference.state_dict()))  # plain values survive any serializer
    assert state["global_samples"] == 75
    expected = [next(reference) for _ in range(30)]
    resumed = make_loader([stream], micro_batch_size=3)
    resumed.load_state_dict(state)
    for want in expected:
        got = next(resumed)
        assert torch.equal(got["inputs"], want["inputs"]) and torch.equal(got["labels"], want["labels"])


def test_resume_on_another_world_size_continues_the_global_sequence(single):
    stream, _, _ = single
    ranks = [make_loader([stream], micro_batch_size=2, dp_rank=rank, dp_world_size=2) for rank in range(2)]
    for _ in range(9):
        for loader in ranks:
            next(loader)
    states = [loader.state_dict() for loader in ranks]
    assert states[0] == states[1]  # every rank holds the same state
    uninterrupted = [[next(loader)["inputs"] for _ in range(3)] for loader in ranks]
    # same global batch (1 x 4 = 2 x 2): rows are the two ranks' rows interleaved
    one = make_loader([stream], micro_batch_size=4)
    one.load_state_dict(states[0])
    def interleaved(step):  # rank 0 row 0, rank 1 row 0, rank 0 row 1, rank 1 row 1 = global samples g .. g + 3
        return torch.stack([uninterrupted[rank][step][row] for row in range(2) for rank in range(2)])

    for step in range(3):
        assert torch.equal(next(one)["inputs"], interleaved(step))
    # a different global batch (4 ranks x 1) still continues the same sequence without gaps or repeats
    four = [make_loader([stream], micro_batch_size=1, dp_rank=rank, dp_world_size=4) for rank in range(4)]
    for loader in four:
        loader.load_state_dict(states[0])
    rows = torch.stack([next(loader)["inputs"][0] for loader in four])
    assert torch.equal(rows, interleaved(0))


def test_state_from_another_seed_or_length_is_refused(single):
    stream, _, _ = single
    state = make_loader([stream]).state_dict()
    with pytest.raises(ValueError, match="seed"):
        make_loader([stream], seed=8).load_state_dict(state)
    with pytest.raises(ValueError, match="seq_len"):
        make_loader([stream], seq_len=8).load_state_dict(state)
    with pytest.raises(ValueError, match="lacks"):
        make_loader([stream]).load_state_dict({"global_samples": 3})


def test_mixing_weights_hold_within_sampling_error(tmp_path):
    bases = [0, 1 << 20, 2 << 20]
    streams = []
    for number, base in enumerate(bases):
        write_synthetic(tmp_path / f"d{number}", f"d{number}", [200 + 100 * number], base=base)
        streams.append(open_train(tmp_path / f"d{number}"))
    weights = [0.5, 0.3, 0.2]
    loader = make_loader(streams, weights, seq_len=4, micro_batch_size=1000)
    draws = 40
    first_tokens = torch.cat([next(loader)["inputs"][:, 0] for _ in range(draws)]).numpy()
    dataset_of = np.searchsorted(np.array(bases), first_tokens, side="right") - 1
    counts = np.bincount(dataset_of, minlength=3)
    total = draws * 1000
    for count, weight in zip(counts, weights):
        sigma = np.sqrt(total * weight * (1 - weight))
        assert abs(count - total * weight) < 4 * sigma, (counts, weights)
    # the per-dataset draw counters match what was drawn, so epochs advance per dataset
    assert list(loader.state_dict()["dataset_samples"].values()) == counts.tolist()
    # every dataset's windows are each used equally often over whole epochs
    first_dataset = np.sort(first_tokens[dataset_of == 0])
    windows = (200 - 1) // 4
    full_epochs = counts[0] // windows
    values, repeats = np.unique(first_dataset, return_counts=True)
    assert len(values) == windows and repeats.min() >= full_epochs and repeats.max() <= full_epochs + 1


def test_resume_with_mixing_is_bit_identical(tmp_path):
    streams = []
    for number in range(2):
        write_synthetic(tmp_path / f"m{number}", f"m{number}", [300, 211], base=number << 20)
        streams.append(open_train(tmp_path / f"m{number}"))
    reference = make_loader(streams, [0.7, 0.3], micro_batch_size=5)
    for _ in range(17):
        next(reference)
    state = reference.state_dict()
    resumed = make_loader(streams, [0.7, 0.3], micro_batch_size=5)
    resumed.load_state_dict(state)
    for _ in range(12):
        assert torch.equal(next(resumed)["inputs"], next(reference)["inputs"])


def test_document_ids_restart_at_each_document(single):
    stream, tokens, lengths = single
    document_of_position = np.repeat(np.arange(len(lengths)), lengths)  # brute force, from the lengths
    loader = make_loader([stream], micro_batch_size=8, document_ids=True)
    for _ in range(10):
        batch = next(loader)
        for inputs, ids in zip(batch["inputs"], batch["document_ids"]):
            start = int(inputs[0])
            documents = document_of_position[start : start + 16]
            np.testing.assert_array_equal(ids.numpy(), documents - documents[0])


def test_validation_windows_are_fixed_and_in_order(tmp_path):
    write_synthetic(tmp_path / "v", "v", [100] * 40, fraction=0.3)
    stream = open_split(tmp_path / "v", "validation", expected_tokenizer=None)
    assert 0 < stream.num_tokens < 4000
    picks = validation_windows([stream], [1.0], 8, 6)
    assert picks == [(0, 8 * window) for window in range(6)]
    with pytest.raises(Exception, match="validation split of .*manifest.json"):
        validation_windows([stream], [1.0], 8, stream.num_windows(8) + 1)
