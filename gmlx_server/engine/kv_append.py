"""A decode step's keys and values written straight into mlx-vlm's KV caches by the kernels' heads primitive.

mlx-vlm's update_and_fetch appends with two SliceUpdates (and their broadcasts), two fetch slices and a page of
Python per layer; GKHeads can write the new rows into the cache's buffers itself (in place when MLX can donate
them) and GKSDPA read the buffers' first rows. This module is the one place that knows those caches' fields:
where the next rows go, and the bookkeeping after a write, as mlx-vlm's own update does it. A cache that must
grow, trim or reorder first, or of another kind (quantized), takes mlx-vlm's own path.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_vlm.models.cache import BatchKVCache, BatchRotatingKVCache, KVCache

from gmlx_server.engine.kv_half import F16BatchKVCache, F16BatchRotatingKVCache, F16KVCache

_BATCH = (BatchKVCache, F16BatchKVCache)
_SINGLE = (KVCache, F16KVCache)
_RING = (BatchRotatingKVCache, F16BatchRotatingKVCache)  # a sliding window's batch ring buffer (Gemma 3)


def slot(cache: Any, length: int, dtype: mx.Dtype) -> tuple[tuple[mx.array, mx.array], int] | None:
    """The cache's (keys, values) buffers and the position its next `length` rows go to; None when it is not one of
    these caches holding `dtype` with room for them as they are."""
    kind, keys = type(cache), cache.keys
    if kind not in _BATCH and kind not in _SINGLE and kind not in _RING:
        return None
    if keys is None or keys.dtype != dtype or cache.values.dtype != dtype:
        return None
    at = _ring_at(cache, length) if kind in _RING else int(cache._idx) if kind in _BATCH else int(cache.offset)
    return ((keys, cache.values), at) if at is not None and at + length <= keys.shape[2] else None


def write(into: tuple[tuple[mx.array, mx.array], int], keys: mx.array, values: mx.array) -> list[mx.array]:
    """The step's rows written into the buffers `slot` gave, at its position, as a SliceUpdate each: the cache's own
    array handles move to the updated buffers, so MLX donates the old ones and writes in place (GKHeads writing them
    itself copied each whole buffer every step: a multi-output primitive's inputs are never donated)."""
    (kbuf, vbuf), at = into
    end = at + keys.shape[2]
    kbuf[:, :, at:end, :] = keys
    vbuf[:, :, at:end, :] = values
    return [kbuf, vbuf]


def _ring_at(cache: Any, length: int) -> int | None:
    """Where a one-token step goes in a ring that neither grows nor trims (its steady state), as mlx-vlm's
    _update_in_place puts it: after the last row, or at 0 once the window is full."""
    size = cache.keys.shape[2]
    grows = cache._offset >= size and size < cache.max_size
    if length != 1 or cache._lengths is not None or grows or size > cache.max_size:
        return None
    return 0 if cache._idx == cache.max_size else int(cache._idx)


def book(cache: Any, keys: mx.array, values: mx.array, length: int) -> tuple[mx.array, mx.array, int]:
    """The buffers written with `length` more rows become the cache's; returns the keys and values attention reads
    and how many of their first rows (update_and_fetch would return those rows sliced)."""
    rows = keys.shape[0]
    if type(cache) in _RING:
        return _ring_book(cache, keys, values, length)
    cache.keys, cache.values = keys, values
    if type(cache) in _BATCH:
        cache.offset = cache.offset + _steps(length, rows)  # the rows' offsets, an mx.array
        cache._idx += length
        return keys, values, int(cache._idx)
    cache.offset += length
    return keys, values, int(cache.offset)


def _ring_book(cache: Any, keys: mx.array, values: mx.array, length: int) -> tuple[mx.array, mx.array, int]:
    """mlx-vlm's _update_in_place after its write: rotate at the window's end, move the left padding once
    rotated, count the rows, and tie the padding and offsets to the keys so they are evaluated with them."""
    rows = keys.shape[0]
    if cache._idx == cache.max_size:
        cache.rotated, cache._idx = True, 0
    if cache.rotated:
        cache.left_padding = cache.left_padding - _steps(length, rows)
    cache.offset = cache.offset + _steps(length, rows)
    cache._offset += length
    cache._idx += length
    cache.keys = mx.depends(keys, (cache.left_padding, cache.offset))
    cache.values = values
    n = cache._offset if cache._offset < cache.max_size else keys.shape[2]
    return cache.keys, cache.values, int(n)


_STEPS: dict[tuple[int, int], mx.array] = {}


def _steps(length: int, rows: int) -> mx.array:
    """`length` for each row, made once: adding a Python int to the offsets would add a Broadcast op per layer."""
    key = (length, rows)
    if key not in _STEPS:
        _STEPS[key] = mx.full((rows,), length, dtype=mx.int32)
        mx.eval(_STEPS[key])
    return _STEPS[key]
