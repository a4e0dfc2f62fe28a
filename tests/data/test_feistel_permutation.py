"""The keyed Feistel permutation and the unit hash behind the sampler and the validation split."""

from __future__ import annotations

import numpy as np
import pytest

from data.permutation import FeistelPermutation, mix64, unit_hash


@pytest.mark.parametrize("size", [1, 2, 3, 5, 16, 17, 100, 1000, 4097, 65537])
def test_feistel_is_a_bijection_of_the_range(size):
    permutation = FeistelPermutation(size, [3, size])
    values = permutation(np.arange(size))
    np.testing.assert_array_equal(np.sort(values), np.arange(size))


def test_feistel_is_pointwise_and_keyed():
    size = 10_007
    indices = np.arange(size)
    first = FeistelPermutation(size, [1, 0])(indices)
    # evaluating a subset gives the same values as the full evaluation
    subset = np.random.default_rng(0).choice(size, 50, replace=False)
    np.testing.assert_array_equal(FeistelPermutation(size, [1, 0])(subset), first[subset])
    other = FeistelPermutation(size, [1, 1])(indices)
    assert np.mean(first == other) < 0.01  # another key, another permutation
    # looks shuffled: position and value are uncorrelated, few fixed points
    assert abs(np.corrcoef(indices, first)[0, 1]) < 0.05
    assert np.sum(first == indices) < 10


def test_feistel_rejects_out_of_range_indices():
    with pytest.raises(IndexError):
        FeistelPermutation(10, [0])(np.array([10]))


def test_mix64_is_injective_on_a_sample_and_unit_hash_is_uniform():
    values = np.random.default_rng(1).integers(0, 2**63, size=100_000, dtype=np.uint64)
    values = np.unique(values)
    assert np.unique(mix64(values)).size == values.size
    hashed = unit_hash(np.arange(200_000), salt=5)
    assert hashed.min() >= 0.0 and hashed.max() < 1.0
    counts, _ = np.histogram(hashed, bins=10, range=(0.0, 1.0))
    assert np.all(np.abs(counts - 20_000) < 4 * np.sqrt(200_000 * 0.1 * 0.9))
    assert not np.array_equal(hashed[:100], unit_hash(np.arange(100), salt=6))
