"""Many `np.random.default_rng([seed, step, index])` generators at once, the same streams, at a third of the cost.

default_rng(entropy) is Generator(PCG64(SeedSequence(entropy))). Of its ~10 us, about half is
SeedSequence.generate_state, the words PCG64 seeds itself from: a fixed hash of the sequence's 4-word pool,
done here for every generator together in a few numpy operations, and handed to PCG64 through a sequence
object that returns them. The pool itself is still numpy's own SeedSequence, built from the words its
list argument coerces to (a uint32 array, without the list's per-element coercion). Entropy outside
what that covers (a word of 2^32 or more, a negative or non-integer entry) goes through default_rng.
tests/model/test_stacked_gradients.py holds the streams identical to default_rng's.
"""
from __future__ import annotations

import sys

import numpy as np
from numpy.random import PCG64, Generator, SeedSequence
from numpy.random.bit_generator import ISeedSequence

# SeedSequence.generate_state's hash: word i of the output is pool[i % 4] xor-ed with the i-th hash
# constant, times the next, then xor-shifted right by 16 (the constants start at INIT_B, times MULT_B a word)
INIT_B, MULT_B, XSHIFT = 0x8B51F9DD, 0x58F38DED, 16
PCG64_WORDS = 8  # PCG64 seeds from generate_state(4, np.uint64): 8 uint32 words


def _hash_constants(n: int) -> np.ndarray:
    constants = [INIT_B]
    for _ in range(n):
        constants.append(constants[-1] * MULT_B & 0xFFFFFFFF)
    return np.array(constants, dtype=np.uint32)


_CONSTANTS = _hash_constants(PCG64_WORDS)


class _Words:
    """A seed sequence that returns words already generated (PCG64 asks for exactly these)."""

    def __init__(self, words: np.ndarray):
        self.words = words

    def generate_state(self, n_words, dtype=np.uint32):
        return self.words


ISeedSequence.register(_Words)


def covered(entropy) -> bool:
    """Whether `generators` builds this entropy's stream itself (else it asks default_rng)."""
    # plain ints of one uint32 word each: the words SeedSequence's list coercion makes of them
    return all(type(e) is int and 0 <= e < 2**32 for e in entropy)


def pcg64_words(pools: np.ndarray) -> np.ndarray:
    """SeedSequence.generate_state(4, np.uint64) of each row of `pools` (n x 4 uint32 pools): n x 4 uint64."""
    words = np.concatenate((pools, pools), axis=1)
    words ^= _CONSTANTS[:-1]
    words *= _CONSTANTS[1:]  # uint32 arithmetic wraps, as the hash's does
    words ^= words >> np.uint32(XSHIFT)
    return words.view(np.uint64)  # pairs of words, low word first (generate_state's view, little-endian)


def generators(entropies: list[tuple]) -> list[Generator]:
    """A Generator for each entropy tuple, the stream `np.random.default_rng(list(entropy))` gives."""
    built = [k for k, e in enumerate(entropies) if covered(e)] if sys.byteorder == "little" else []
    out: list = [None] * len(entropies)
    if built:
        pools = np.empty((len(built), 4), dtype=np.uint32)
        for j, k in enumerate(built):
            pools[j] = SeedSequence(np.array(entropies[k], dtype=np.uint32)).pool
        for k, words in zip(built, pcg64_words(pools)):
            out[k] = Generator(PCG64(_Words(words)))
    for k, entropy in enumerate(entropies):
        if out[k] is None:
            out[k] = np.random.default_rng(list(entropy))
    return out
