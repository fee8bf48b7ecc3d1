"""Copy a single-row prefill cache into a prompt-cache Entry, and build fresh caches back from one.

Runs on the engine thread only. MLX arrays are values: a snapshot holds its own array objects, and a
restore hands each cache new slices, so a cache's in-place slice assignment never reaches a snapshot.
A layer is (kind, arrays, meta): "kv" keys and values (fp32 or float16, as the model's kv_dtype builds its
caches: a restore's fresh caches are of the same kind), "rot" a sliding window's, "q" the packed parts of
a uniform quantized cache, "kvarn" its quantized parts then its unquantized tail (engine/kv_quant.py).
Quantized layers are stored packed: a restore never re-quantizes, so it is exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import mlx.core as mx
from mlx_vlm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache

from gmlx_server.engine.kv_half import F16KVCache, F16RotatingKVCache
from gmlx_server.engine.kv_quant import KVarnCache
from gmlx_server.engine.prompt_cache import Entry

Layer = tuple[str, tuple[mx.array, ...], tuple[Any, ...]]


def has_window(cache: Sequence[Any]) -> bool:
    """Sliding-window layers keep only their last window: such a cache cannot be cut back in general."""
    return any(isinstance(c, RotatingKVCache) for c in cache)


def take(cache: Sequence[Any], tokens: Sequence[int], kind: Literal["prompt", "ckpt"] = "prompt",
         tail: int | None = None, pinned: bool = False) -> Entry | None:
    """A copy of `cache` (which holds exactly `tokens`); None for cache types it cannot copy."""
    layers: list[Layer] = []
    for c in cache:
        layer = _layer(c)
        if layer is None or c.offset != len(tokens):
            return None
        layers.append(layer)
    # Below the window nothing has rotated out yet: the keys are in order and can be cut back.
    trimmable = all(c.offset < c.max_size for c in cache if type(c) in _ROTATING)
    mx.eval([a for layer in layers for a in layer[1]])
    nbytes = sum(a.nbytes for layer in layers for a in layer[1])
    return Entry(tuple(tokens), tuple(layers), nbytes, trimmable, kind, tail, pinned)


_PLAIN, _ROTATING = (KVCache, F16KVCache), (RotatingKVCache, F16RotatingKVCache)  # fp32 or float16 (kv_dtype)


def _layer(c: Any) -> Layer | None:
    if type(c) in _PLAIN:
        return "kv", _copy(c.state), ()
    if type(c) in _ROTATING:
        return "rot", _copy(c.state), tuple(c.meta_state)
    if type(c) is QuantizedKVCache:
        keys, values = c.state
        return "q", _copy((*keys, *values)), (c.group_size, c.bits)
    if type(c) is KVarnCache:
        return "kvarn", _copy(c.arrays()), (c.ks.used, c.flen)
    return None  # other caches: not cached


def _copy(arrays: Sequence[mx.array]) -> tuple[mx.array, ...]:
    return tuple(mx.contiguous(a) for a in arrays)


def restore(entry: Entry, n: int, make_cache: Callable[[], list[Any]]) -> list[Any]:
    """Fresh caches holding the entry's first `n` tokens (n < its length only when it is trimmable)."""
    cache = make_cache()
    for c, (kind, arrays, meta) in zip(cache, entry.layers, strict=True):
        if kind == "kvarn":
            _restore_kvarn(c, arrays, meta, n)
            continue
        cut = tuple(a[..., :n, :] for a in arrays)
        if kind == "q":
            c.keys, c.values, c.offset = cut[:3], cut[3:], n
        elif kind == "rot" and n == len(entry.tokens):
            c.state = tuple(a[..., :, :] for a in arrays)  # new array objects: in-place writes stay the cache's
            c.meta_state = meta
        else:
            c.state = cut
            if kind == "rot":
                c.meta_state = (meta[0], meta[1], str(n), str(n))
    return cache


def _restore_kvarn(c: KVarnCache, arrays: tuple[mx.array, ...], meta: tuple[Any, ...], n: int) -> None:
    """The first n tokens: quantized ones from the store, then any of the unquantized tail."""
    stored, _ = meta
    q = min(n, stored)
    parts = arrays[:6] if stored else ()
    c.ks.set(tuple(a[..., :q, :] for a in parts[:3]) if q else None, q)
    c.vs.set(tuple(a[..., :q, :] for a in parts[3:]) if q else None, q)
    tail = arrays[len(parts):]
    if n > q and tail:
        c.fk, c.fv = tail[0][..., : n - q, :], tail[1][..., : n - q, :]
    c.offset = n
