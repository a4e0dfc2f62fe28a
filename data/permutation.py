"""Seeded pseudo-random permutations of [0, n) evaluated pointwise, and a stable 64-bit hash.

Why not `numpy.random.Generator.permutation(n)`: a 10T-token corpus at T = 8192 has ~1.2e9
windows; materializing a permutation of them costs ~10 GB per rank per epoch. A keyed
Feistel network is a bijection computed index by index in O(1) memory (format-preserving
encryption, Black & Rogaway 2002, "Ciphers with arbitrary finite domains"):

    bits  = 2 * h, the smallest even number with 2**bits >= n
    x     = (L, R), L = x >> h, R = x & (2**h - 1)
    round: (L, R) -> (R, L XOR (mix64(R XOR k_i) & (2**h - 1)))      for i = 0 .. ROUNDS-1
    cycle walking: y = F(x); while y >= n: y = F(y)

A Feistel network is a bijection of [0, 2**bits) whatever its round function; cycle walking
restricts it to a bijection of [0, n) (2**bits < 4n, so fewer than 4 evaluations per index on
average). Round keys k_i come from `numpy.random.SeedSequence(key).generate_state`, and
`mix64` is the splitmix64 finalizer (Steele, Lea & Flood 2014), a bijection of uint64 with
good avalanche; both are stable across numpy versions, so a resume on another install picks
the same windows.
"""

from __future__ import annotations

import numpy as np

ROUNDS = 6
"""Feistel rounds: 4 suffice for a pseudo-random permutation (Luby-Rackoff); 6 for margin."""


def mix64(values: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer on uint64 (wrapping arithmetic): a bijective 64-bit mixing function."""
    x = np.asarray(values, dtype=np.uint64)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def unit_hash(indices: np.ndarray, salt: int) -> np.ndarray:
    """A fixed pseudo-random number in [0, 1) per non-negative integer index (float64, 53 bits)."""
    x = np.asarray(indices, dtype=np.uint64) ^ np.uint64(salt & 0xFFFFFFFFFFFFFFFF)
    return (mix64(mix64(x)) >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)


class FeistelPermutation:
    """A bijection of [0, size) chosen by `key` (a sequence of non-negative ints), applied to index arrays."""

    def __init__(self, size: int, key: list[int] | tuple[int, ...]):
        if size < 1:
            raise ValueError(f"permutation size must be >= 1, got {size}")
        self.size = int(size)
        bits = max(2, (self.size - 1).bit_length())
        self.half_bits = (bits + 1) // 2
        self.half_mask = np.uint64((1 << self.half_bits) - 1)
        self.round_keys = np.random.SeedSequence(list(key)).generate_state(ROUNDS, dtype=np.uint64)

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        shift = np.uint64(self.half_bits)
        left, right = x >> shift, x & self.half_mask
        for round_key in self.round_keys:
            left, right = right, left ^ (mix64(right ^ round_key) & self.half_mask)
        return (left << shift) | right

    def __call__(self, indices: np.ndarray | int) -> np.ndarray:
        """Permuted positions of `indices` (int64 array of the same shape)."""
        x = np.atleast_1d(np.asarray(indices, dtype=np.int64))
        if x.size and (x.min() < 0 or x.max() >= self.size):
            raise IndexError(f"permutation index out of range [0, {self.size})")
        y = self._feistel(x.astype(np.uint64))
        outside = y >= np.uint64(self.size)
        while outside.any():  # cycle walking: terminates because x itself lies in range
            y[outside] = self._feistel(y[outside])
            outside = y >= np.uint64(self.size)
        return y.astype(np.int64)
