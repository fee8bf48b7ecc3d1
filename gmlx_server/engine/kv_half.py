"""Float16 KV caches: mlx-vlm's plain and sliding-window caches holding keys and values at 2 bytes an element.

The CPU runs fp32 activations, so mlx-vlm's caches (which take the dtype of the first keys they see) hold fp32:
at a long context a decode step's attention reads 4 bytes per element of every cached key and value. These
subclasses cast each update to float16 before storing it, so every buffer they allocate, grow or merge is
float16; the kernels' GKSDPA reads them as stored and widens in registers (src/vec_kernels.h). Without the
kernels, MLX's matmuls promote them to float32 per call. Quantized layers (kv_quant) take fp32 input as before.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_vlm.models.cache import BatchKVCache, BatchRotatingKVCache, KVCache, RotatingKVCache, _BaseCache

HALF = mx.float16


def _half(keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
    """Cast to float16; keys and values that already are (the kernels' heads primitive writes them so) pass."""
    if keys.dtype == HALF and values.dtype == HALF:
        return keys, values
    return keys.astype(HALF), values.astype(HALF)


class _Half(_BaseCache):
    """Each update cast to float16 before the mlx-vlm cache after this class in the MRO stores it."""

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> Any:
        return super().update_and_fetch(*_half(keys, values))


class _HalfBatch(_Half):
    def extend(self, other: Any) -> None:
        super().extend(other)
        _stay_half(self)


class F16KVCache(_Half, KVCache):
    pass


class F16RotatingKVCache(_Half, RotatingKVCache):
    pass


class F16BatchKVCache(_HalfBatch, BatchKVCache):
    pass


class F16BatchRotatingKVCache(_HalfBatch, BatchRotatingKVCache):
    pass


def _stay_half(c: Any) -> None:
    """mlx-vlm pads a row without keys with an fp32 empty array, which would promote the joined buffers."""
    if c.keys is not None and c.keys.dtype != HALF:
        c.keys, c.values = _half(c.keys, c.values)


def stores_half(c: Any) -> bool:
    """The cache stores float16 keys and values (one of this module's caches)."""
    return isinstance(c, _Half)


def as_half(c: Any) -> Any:
    """A fresh plain or sliding-window cache -> its float16 form; any other cache as it is."""
    if type(c) is KVCache:
        return F16KVCache()
    if type(c) is RotatingKVCache:
        return F16RotatingKVCache(c.max_size, c.keep)
    return c


def batch_half(c: Any) -> Any:
    """One stream's float16 cache -> the float16 batch form (None for any other cache)."""
    if isinstance(c, F16RotatingKVCache):
        return F16BatchRotatingKVCache.merge([c])
    if isinstance(c, F16KVCache):
        return F16BatchKVCache.merge([c])
    return None
