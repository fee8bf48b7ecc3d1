"""A decode step's keys and values written straight into mlx-vlm's KV caches by the kernels' heads primitive.

mlx-vlm's update_and_fetch appends with two SliceUpdates (and their broadcasts), two fetch slices and a page of
Python per layer; `append` writes the new rows into the cache's buffers with one SliceUpdate each (in place:
MLX donates them) and GKSDPA reads the buffers' first rows. This module is the one place that knows those
caches' fields: where the next rows go, and the bookkeeping after a write, as mlx-vlm's own update does it. A
cache that must grow, trim or reorder first, or of another kind (quantized), takes mlx-vlm's own path.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_vlm.models.cache import BatchKVCache, BatchRotatingKVCache, KVCache

from gmlx_server.engine.kv_half import F16BatchKVCache, F16BatchRotatingKVCache, F16KVCache

_BATCH = (BatchKVCache, F16BatchKVCache)
_SINGLE = (KVCache, F16KVCache)
_RING = (BatchRotatingKVCache, F16BatchRotatingKVCache)  # a sliding window's batch ring buffer (Gemma 3)


def append(cache: Any, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array, int] | None:
    """The step's (B, Hk, L, D) keys and values written into the cache's buffers, one SliceUpdate each: the cache's
    handles move to the updated buffers, so MLX donates the old ones and writes in place (a multi-output primitive's
    inputs are never donated). Returns the buffers attention reads and how many of their first rows; None (nothing
    written) when the cache is not one of these, holds another dtype or has no room for the rows as it is."""
    length = keys.shape[2]
    at = _slot(cache, length, keys.dtype)
    if at is None:
        return None
    cache.keys[:, :, at:at + length, :] = keys
    cache.values[:, :, at:at + length, :] = values
    return _ring_book(cache, length) if type(cache) in _RING else _book(cache, length)


def _slot(cache: Any, length: int, dtype: mx.Dtype) -> int | None:
    """Where the cache's next `length` rows go; None when it is not one of these caches holding `dtype` with room."""
    kind, keys = type(cache), cache.keys
    if kind not in _BATCH and kind not in _SINGLE and kind not in _RING:
        return None
    if keys is None or keys.dtype != dtype or cache.values.dtype != dtype:
        return None
    at = _ring_at(cache, length) if kind in _RING else int(cache._idx) if kind in _BATCH else int(cache.offset)
    return at if at is not None and at + length <= keys.shape[2] else None


def _ring_at(cache: Any, length: int) -> int | None:
    """Where a one-token step goes in a ring that neither grows nor trims (its steady state), as mlx-vlm's
    _update_in_place puts it: after the last row, or at 0 once the window is full."""
    size = cache.keys.shape[2]
    grows = cache._offset >= size and size < cache.max_size
    if length != 1 or cache._lengths is not None or grows or size > cache.max_size:
        return None
    return 0 if cache._idx == cache.max_size else int(cache._idx)


def _book(cache: Any, length: int) -> tuple[mx.array, mx.array, int]:
    """Count `length` more rows written; returns the keys and values attention reads and how many of their first
    rows (update_and_fetch would return those rows sliced)."""
    if type(cache) in _BATCH:
        cache.offset = cache.offset + _steps(length, cache.keys.shape[0])  # the rows' offsets, an mx.array
        cache._idx += length
        return cache.keys, cache.values, int(cache._idx)
    cache.offset += length
    return cache.keys, cache.values, int(cache.offset)


def _ring_book(cache: Any, length: int) -> tuple[mx.array, mx.array, int]:
    """mlx-vlm's _update_in_place after its write: rotate at the window's end, move the left padding once
    rotated, count the rows, and tie the padding and offsets to the keys so they are evaluated with them."""
    keys, rows = cache.keys, cache.keys.shape[0]
    if cache._idx == cache.max_size:
        cache.rotated, cache._idx = True, 0
    if cache.rotated:
        cache.left_padding = cache.left_padding - _steps(length, rows)
    cache.offset = cache.offset + _steps(length, rows)
    cache._offset += length
    cache._idx += length
    cache.keys = mx.depends(keys, (cache.left_padding, cache.offset))
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
