"""A decode step's keys and values written straight into mlx-vlm's plain KV caches by the kernels' heads primitive.

mlx-vlm's update_and_fetch appends with two SliceUpdates (and their broadcasts) and a page of Python per layer;
GKHeads can write the new rows into the cache's buffers itself (in place when MLX can donate them). This module
is the one place that knows those caches' fields: where the next rows go, and the bookkeeping after a write.
A cache without room (its buffer grows by mlx-vlm's step) or of another kind takes mlx-vlm's own path.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_vlm.models.cache import BatchKVCache, KVCache

from gmlx_server.engine.kv_half import F16BatchKVCache, F16KVCache

# plain caches only: a sliding window's ring buffer (RotatingKVCache) writes where mlx-vlm's own logic says
_BATCH = (BatchKVCache, F16BatchKVCache)
_SINGLE = (KVCache, F16KVCache)


def slot(cache: Any, length: int, dtype: mx.Dtype) -> tuple[tuple[mx.array, mx.array], int] | None:
    """The cache's (keys, values) buffers and the position its next `length` rows go to; None when it is not a
    plain cache holding `dtype` with room for them."""
    kind = type(cache)
    if kind not in _BATCH and kind not in _SINGLE:
        return None
    keys = cache.keys
    if keys is None or keys.dtype != dtype or cache.values.dtype != dtype:
        return None
    at = int(cache._idx) if kind in _BATCH else int(cache.offset)
    return ((keys, cache.values), at) if at + length <= keys.shape[2] else None


def book(cache: Any, keys: mx.array, values: mx.array, length: int) -> int:
    """The buffers written with `length` more rows become the cache's; returns how many of their rows attention
    reads (every row up to the new end: update_and_fetch would return them sliced)."""
    cache.keys, cache.values = keys, values
    if type(cache) in _BATCH:
        cache.offset = cache.offset + _steps(length, keys.shape[0])  # the rows' offsets, an mx.array
        cache._idx += length
        end = cache._idx
    else:
        cache.offset += length
        end = cache.offset
    return int(end)


_STEPS: dict[tuple[int, int], mx.array] = {}


def _steps(length: int, rows: int) -> mx.array:
    """`length` for each row, made once: adding a Python int to the offsets would add a Broadcast op per layer."""
    key = (length, rows)
    if key not in _STEPS:
        _STEPS[key] = mx.full((rows,), length, dtype=mx.int32)
        mx.eval(_STEPS[key])
    return _STEPS[key]
