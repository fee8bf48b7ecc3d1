"""A per-model prompt cache: KV snapshots keyed by token prefixes, bounded in bytes, evicted LRU.

The key is the prompt's token ids themselves, so two requests share state only when their rendered
prompts agree token for token: chat_template_kwargs (or a system prompt) that change the rendered
text change the tokens and never collide. One cache per engine, so models never share one either.

Tiers of a hit: exact (the same full prompt), anchor (a pinned prefix), ckpt (a snapshot at a
message boundary, or any exact-length snapshot of a cache that cannot be cut back: sliding-window
layers only hold their last window), block (a partial reuse of a trimmable snapshot, found through
hash-chained fixed-size token blocks). Below them, the disk tier (disk_cache.py) keeps what this cache
stores across restarts; engine/cache_tiers.py asks both. Pure Python: the MLX side is kv_snapshot.py.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gmlx_plan.pace import CACHE_BLOCK

Tier = Literal["exact", "block", "ckpt", "anchor", "disk"]  # disk: restored from the disk tier (disk_cache.py)
TIERS: tuple[Tier, ...] = ("exact", "block", "ckpt", "anchor", "disk")
BLOCK = CACHE_BLOCK  # gmlx plan's simulator reuses prefixes at the same granularity
PIN_SHARE = 0.5  # pinned anchors hold at most this share of the bound; older pins fall back to plain LRU
Key = tuple[int, ...]


@dataclass
class Entry:
    """One snapshot: the KV of `tokens` (layers are opaque here), `nbytes` of array data."""

    tokens: Key
    layers: tuple[Any, ...]
    nbytes: int
    trimmable: bool  # every layer can be cut back to any shorter prefix
    kind: Literal["prompt", "ckpt"] = "prompt"
    tail: int | None = None  # the prompt's last token when stored one short of it (exact tier)
    pinned: bool = False


@dataclass(frozen=True)
class Hit:
    entry: Entry
    tokens: int  # how many leading prompt tokens to restore
    tier: Tier


def block_hashes(tokens: Sequence[int], block: int = BLOCK) -> list[int]:
    """The chain hash at each full block boundary: equal hashes mean equal prefixes (collisions are re-checked)."""
    out, h = [], 0
    for end in range(block, len(tokens) + 1, block):
        h = hash((h, tuple(tokens[end - block: end])))
        out.append(h)
    return out


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PromptCache:
    """Mutated by the engine thread only; other threads read `published` or call peek() (under the lock)."""

    def __init__(self, max_bytes: int, block: int = BLOCK, spill: Callable[[Entry], object] | None = None) -> None:
        self.max_bytes, self.block = max_bytes, block
        self._spill = spill  # the disk tier's non-blocking put: what this cache stores also goes to disk
        self._entries: OrderedDict[Key, Entry] = OrderedDict()  # least recently used first
        self._blocks: dict[int, OrderedDict[Key, None]] = {}  # chain hash -> trimmable entries covering it
        self._lengths: dict[int, int] = {}  # entry length -> how many entries have it
        self.bytes = self.evictions = self.misses = self.tokens_reused = self.stores = self.rejected = 0
        self.hits: dict[str, int] = dict.fromkeys(TIERS, 0)
        self._lock = threading.Lock()
        self.published: dict[str, Any] = self.stats()

    def __len__(self) -> int:
        return len(self._entries)

    # --- lookup ------------------------------------------------------------------------------

    def lookup(self, prompt: Sequence[int]) -> Hit | None:
        """The longest reusable prefix, always leaving one prompt token to prefill (it yields the logits)."""
        with self._lock:
            best = self._best(prompt)
            self._count(best)
        return best

    def record(self, hit: Hit | None) -> None:
        """Count a lookup that peek() and the disk tier answered together (the hit may be the disk's)."""
        with self._lock:
            self._count(hit)

    def peek(self, prompt: Sequence[int]) -> Hit | None:
        """What lookup() would find now, without counting it or refreshing recency (for /v1/estimate)."""
        with self._lock:
            return self._best(prompt)

    def _best(self, prompt: Sequence[int]) -> Hit | None:
        limit = len(prompt) - 1
        best: Hit | None = None
        if limit > 0:
            for hit in (*self._prefix_hits(prompt, limit), self._block_hit(prompt, limit)):
                if hit is not None and (best is None or hit.tokens > best.tokens):
                    best = hit
        return best

    def _prefix_hits(self, prompt: Sequence[int], limit: int) -> list[Hit]:
        """Entries whose tokens are a whole prefix of the prompt (or the whole prompt)."""
        out = []
        for length in sorted(self._lengths, reverse=True):
            entry = self._entries.get(tuple(prompt[:length])) if length <= len(prompt) else None
            if entry is None:
                continue
            use = min(length, limit)
            if (use < length and not entry.trimmable) or use <= 0:
                continue
            out.append(Hit(entry, use, self._tier(entry, prompt, use)))
        return out

    def _block_hit(self, prompt: Sequence[int], limit: int) -> Hit | None:
        """A trimmable entry sharing the most leading blocks with the prompt, extended token by token."""
        for h in reversed(block_hashes(prompt[:limit], self.block)):
            owners = self._blocks.get(h)
            if owners:
                entry = self._entries[next(reversed(owners))]  # the most recently stored
                use = min(common_prefix(entry.tokens, prompt), limit)
                if use > 0:
                    return Hit(entry, use, self._tier(entry, prompt, use))
        return None

    def _tier(self, entry: Entry, prompt: Sequence[int], use: int) -> Tier:
        n = len(entry.tokens)
        whole = n == len(prompt) and entry.tokens == tuple(prompt)
        one_short = entry.tail is not None and n == len(prompt) - 1 and prompt[-1] == entry.tail and use == n
        if whole or one_short:
            return "exact"
        if entry.pinned:
            return "anchor"
        return "ckpt" if entry.kind == "ckpt" or (use == n and not entry.trimmable) else "block"

    def _count(self, hit: Hit | None) -> None:
        if hit is None:
            self.misses += 1
        else:
            self.hits[hit.tier] += 1
            self.tokens_reused += hit.tokens
            if hit.entry.tokens in self._entries:  # a disk hit's entry may not have fit in RAM
                self._entries.move_to_end(hit.entry.tokens)
        self._publish()

    # --- store -------------------------------------------------------------------------------

    def store(self, entry: Entry, spill: bool = True) -> bool:
        """Insert (evicting least recently used unpinned entries to fit); False when it cannot fit. A new entry
        also goes to the disk tier unless `spill` is False (it came from there)."""
        with self._lock:
            return self._store(entry, spill)

    def _store(self, entry: Entry, spill: bool) -> bool:
        old = self._entries.get(entry.tokens)
        if old is not None:
            old.kind = "ckpt" if entry.kind == "ckpt" else old.kind
            self._entries.move_to_end(entry.tokens)
            if entry.pinned and not old.pinned:
                self._pin(old)
            self._publish()
            return True
        if entry.pinned:
            self._pin(entry)
        if not self._make_room(entry.nbytes):
            self.rejected += 1
            self._publish()
            return False
        self._entries[entry.tokens] = entry
        self.bytes += entry.nbytes
        self.stores += 1
        if self._spill is not None and spill:
            self._spill(entry)
        self._lengths[len(entry.tokens)] = self._lengths.get(len(entry.tokens), 0) + 1
        if entry.trimmable:
            for h in block_hashes(entry.tokens, self.block):
                self._blocks.setdefault(h, OrderedDict())[entry.tokens] = None
        self._publish()
        return True

    def _pin(self, entry: Entry) -> None:
        """Pin `entry` within PIN_SHARE of the bound, unpinning the least recently used pins to make room;
        without a cap, every distinct system prompt would stay forever and crowd out everything else."""
        limit = self.max_bytes * PIN_SHARE
        entry.pinned = entry.nbytes <= limit
        pins = [e for e in self._entries.values() if e.pinned and e is not entry]  # least recent first
        total = sum(e.nbytes for e in pins) + (entry.nbytes if entry.pinned else 0)
        for old in pins:
            if total <= limit:
                break
            old.pinned = False
            total -= old.nbytes

    def _make_room(self, nbytes: int) -> bool:
        if nbytes > self.max_bytes:
            return False
        victims = [k for k, e in self._entries.items() if not e.pinned]  # least recent first
        freeable = sum(self._entries[k].nbytes for k in victims)
        if self.bytes - freeable + nbytes > self.max_bytes:
            return False  # pinned entries hold the rest: evicting would not help
        for key in victims:
            if self.bytes + nbytes <= self.max_bytes:
                break
            self._remove(key)
            self.evictions += 1
        return True

    def _remove(self, key: Key) -> None:
        entry = self._entries.pop(key)
        self.bytes -= entry.nbytes
        self._lengths[len(key)] -= 1
        if not self._lengths[len(key)]:
            del self._lengths[len(key)]
        if entry.trimmable:
            for h in block_hashes(key, self.block):
                owners = self._blocks.get(h)
                if owners is not None:
                    owners.pop(key, None)
                    if not owners:
                        del self._blocks[h]

    def reset(self) -> None:
        """Drop every entry, pinned ones too; counters keep counting (they are lifetime totals)."""
        with self._lock:
            for key in list(self._entries):
                self._remove(key)
            self._publish()

    # --- stats -------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        pins = [e.nbytes for e in self._entries.values() if e.pinned]
        return {"enabled": True, "max_bytes": self.max_bytes, "bytes": self.bytes, "entries": len(self._entries),
                "pinned": len(pins), "pinned_bytes": sum(pins), "hits": dict(self.hits),
                "misses": self.misses, "tokens_reused": self.tokens_reused, "evictions": self.evictions,
                "stores": self.stores, "rejected": self.rejected, "block_tokens": self.block}

    def _publish(self) -> None:
        self.published = self.stats()  # one reference swap: readers on other threads see a whole dict
