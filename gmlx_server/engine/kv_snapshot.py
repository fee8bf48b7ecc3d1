"""Copy a single-row prefill cache into a prompt-cache Entry, and build fresh caches back from one.

Runs on the engine thread only. MLX arrays are values: a snapshot holds its own array objects, and a
restore hands each cache new slices, so a cache's in-place slice assignment never reaches a snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import mlx.core as mx
from mlx_vlm.models.cache import KVCache, RotatingKVCache

from gmlx_server.engine.prompt_cache import Entry


def has_window(cache: Sequence[Any]) -> bool:
    """Sliding-window layers keep only their last window: such a cache cannot be cut back in general."""
    return any(isinstance(c, RotatingKVCache) for c in cache)


def take(cache: Sequence[Any], tokens: Sequence[int], kind: Literal["prompt", "ckpt"] = "prompt",
         tail: int | None = None, pinned: bool = False) -> Entry | None:
    """A copy of `cache` (which holds exactly `tokens`); None for cache types it cannot copy."""
    layers: list[Any] = []
    trimmable = True
    for c in cache:
        if type(c) is KVCache:
            layers.append(("kv", *_copy(c.state), None))
        elif type(c) is RotatingKVCache:
            # Below the window nothing has rotated out yet: the keys are in order and can be cut back.
            trimmable = trimmable and c.offset < c.max_size
            layers.append(("rot", *_copy(c.state), tuple(c.meta_state)))
        else:
            return None  # quantized or other caches: not cached
        if c.offset != len(tokens):
            return None
    mx.eval([a for layer in layers for a in layer[1:3]])
    nbytes = sum(layer[1].nbytes + layer[2].nbytes for layer in layers)
    return Entry(tuple(tokens), tuple(layers), nbytes, trimmable, kind, tail, pinned)


def _copy(state: Any) -> tuple[mx.array, mx.array]:
    keys, values = state
    return mx.contiguous(keys), mx.contiguous(values)


def restore(entry: Entry, n: int, make_cache: Callable[[], list[Any]]) -> list[Any]:
    """Fresh caches holding the entry's first `n` tokens (n < its length only when it is trimmable)."""
    cache = make_cache()
    for c, (kind, keys, values, meta) in zip(cache, entry.layers, strict=True):
        if kind == "rot" and n == len(entry.tokens):
            c.state = (keys[..., :, :], values[..., :, :])
            c.meta_state = meta
            continue
        c.state = (keys[..., :n, :], values[..., :n, :])
        if kind == "rot":
            keep, max_size = meta[0], meta[1]
            c.meta_state = (keep, max_size, str(n), str(n))
    return cache
