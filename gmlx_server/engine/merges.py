"""SentencePiece merges derived from a GGUF vocabulary alone (the file stores none): every split of a piece into
two vocabulary pieces, ranked as `derive_merges` says; vectorised with numpy over a hash index of substrings.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

NORMAL, USER_DEFINED = 1, 4  # llama.cpp token types whose pieces can be merged
_HASH_MUL = 0x100000001B3  # odd, so it is invertible mod 2**64 (suffix hashes need the inverse)
_SLOT_MUL = 0x9E3779B97F4A7C15


def derive_merges(
    spelled: Sequence[str], types: NDArray[np.int64], score: NDArray[np.float64]
) -> list[tuple[str, str]]:
    """Every (left, right) whose concatenation is a token, best-scored result first, longer left first.

    transformers' `generate_merges`, vectorised (it takes ~5 s in Python on a 262k vocabulary): all
    strings live in one UTF-32 buffer, a substring is compared by its 64-bit polynomial hash (from
    prefix sums) and its length, so no Python loop runs per split.
    """
    n = len(spelled)
    lens = np.fromiter(map(len, spelled), dtype=np.int64, count=n)
    kinds = np.asarray(types, dtype=np.int64)
    piece = (kinds == NORMAL) | (kinds == USER_DEFINED)
    index = _SubstringIndex(spelled, lens, np.nonzero(piece)[0])
    cand = np.nonzero(piece & (lens > 1))[0]
    splits = lens[cand] - 1
    target = np.repeat(cand, splits)
    cut = np.arange(target.size) - np.repeat(np.cumsum(splits) - splits, splits) + 1
    left = index.find(target, 0, cut)
    found = left >= 0
    target, cut, left = target[found], cut[found], left[found]
    right = index.find(target, cut, lens[target])
    found = right >= 0
    target, cut, left, right = target[found], cut[found], left[found], right[found]
    # transformers' order as one int key: best score, longer left, longer right; ties stay in id order.
    _, score_rank = np.unique(-score, return_inverse=True)
    width = int(lens.max()) + 1
    key = (score_rank[target] * width + width - cut) * width + width - (lens[target] - cut)
    rank = np.argsort(key, kind="stable")
    pick = spelled.__getitem__
    return list(zip(map(pick, left[rank].tolist()), map(pick, right[rank].tolist()), strict=True))


class _SubstringIndex:
    """Looks up `token[start:stop]` among a set of tokens by hash, for many tokens at once.

    Substring hashes come from prefix sums over one UTF-32 buffer; members sit in an
    open-addressing table (linear probing), probed for all queries together.
    """

    def __init__(self, spelled: Sequence[str], lens: NDArray[np.int64], members: NDArray[np.int64]) -> None:
        codes = np.frombuffer("".join(spelled).encode("utf-32-le"), dtype=np.uint32)
        self.offsets = np.zeros(len(spelled) + 1, dtype=np.int64)
        np.cumsum(lens, out=self.offsets[1:])
        self.lens = lens
        powers = np.full(codes.size + 1, _HASH_MUL, dtype=np.uint64)
        inverse = np.full(codes.size + 1, pow(_HASH_MUL, -1, 1 << 64), dtype=np.uint64)
        powers[0] = inverse[0] = 1
        self.prefix = np.zeros(codes.size + 1, dtype=np.uint64)
        with np.errstate(over="ignore"):  # all arithmetic is mod 2**64 on purpose
            np.cumprod(powers, out=powers)
            np.cumprod(inverse, out=inverse)
            np.cumsum(codes.astype(np.uint64) * powers[:-1], out=self.prefix[1:])
        self.inverse = inverse
        self.bits = max(int(members.size).bit_length() + 1, 4)  # load factor <= 1/2
        self.keys = np.zeros(1 << self.bits, dtype=np.uint64)
        self.ids = np.full(1 << self.bits, -1, dtype=np.int64)
        self._insert(self._hash(self.offsets[members], self.offsets[members + 1]), members)

    def _hash(self, a: NDArray[np.int64], b: NDArray[np.int64]) -> NDArray[np.uint64]:
        with np.errstate(over="ignore"):
            return (self.prefix[b] - self.prefix[a]) * self.inverse[a]

    def _slot(self, hashes: NDArray[np.uint64]) -> NDArray[np.int64]:
        # Fibonacci hashing: short strings have small hashes, so mix before taking the top bits.
        with np.errstate(over="ignore"):
            return ((hashes * np.uint64(_SLOT_MUL)) >> np.uint64(64 - self.bits)).astype(np.int64)

    def _insert(self, hashes: NDArray[np.uint64], members: NDArray[np.int64]) -> None:
        mask = self.ids.size - 1
        slot, todo = self._slot(hashes), np.arange(members.size)
        while todo.size:
            s = slot[todo]
            free = self.ids[s] < 0
            taken, first = np.unique(s[free], return_index=True)  # one winner per free slot
            won = todo[free][first]
            self.keys[taken], self.ids[taken] = hashes[won], members[won]
            placed = np.zeros(members.size, dtype=bool)
            placed[won] = True
            todo = todo[~placed[todo]]
            slot[todo] = (slot[todo] + 1) & mask

    def find(
        self, tokens: NDArray[np.int64], start: int | NDArray[np.int64], stop: NDArray[np.int64]
    ) -> NDArray[np.int64]:
        """Member id equal to each `tokens[k][start:stop]`, or -1 (equal lengths too: collision guard)."""
        base = self.offsets[tokens]
        hashes = self._hash(base + start, base + stop)
        found = np.full(hashes.size, -1, dtype=np.int64)
        mask = self.ids.size - 1
        slot, todo = self._slot(hashes), np.arange(hashes.size)
        while todo.size:
            s = slot[todo]
            ids = self.ids[s]
            hit = (ids >= 0) & (self.keys[s] == hashes[todo])
            found[todo[hit]] = ids[hit]
            more = (ids >= 0) & ~hit
            todo = todo[more]
            slot[todo] = (s[more] + 1) & mask
        ok = (found >= 0) & (self.lens[np.maximum(found, 0)] == stop - start)
        return np.where(ok, found, -1)
