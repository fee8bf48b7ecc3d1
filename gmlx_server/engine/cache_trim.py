"""Take back the newest tokens of a request's per-layer KV caches: a speculative round's rejected drafts.

A round writes k + 1 positions into the target's caches (and k into the drafter's) and keeps only the
accepted ones; `trim(caches, n)` drops the newest n tokens from every layer, so the next forward pass
sees exactly what a cache that never held them would (tests/unit/test_cache_trim.py). It covers every
cache the engine builds, one stream's and the batch forms: mlx-vlm's KVCache, QuantizedKVCache,
RotatingKVCache and their Batch* forms (each moves its offset back), and gmlx's kvarn caches (which
take back only their latest update: the quantized store does not keep exact values).

A sliding-window cache cannot be cut back once it has wrapped: its oldest tokens were overwritten. So
before a round, `trim_room(caches)` says how many positions it may write and still roll back; a request
whose room is too small for a round decodes plainly from then on (its window is full, for good).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlx_vlm.models.cache import BatchRotatingKVCache, RotatingKVCache

from gmlx_server.engine.kv_quant import is_kvarn
from gmlx_server.engine.vlm_adapter import batch_columns, trimmable


def _held(c: Any) -> int:
    """Tokens the cache can give back: one stream's offset, or the batch forms' shared column count."""
    if isinstance(c, BatchRotatingKVCache):
        return int(c._offset)
    columns = batch_columns(c)
    if columns is not None:
        return columns  # BatchKVCache, BatchQuantizedKVCache: per-row offsets, one column count
    if is_kvarn(c):
        return int(c.size_held)
    return int(c.offset)


def _window_room(c: Any) -> int | None:
    """Positions a sliding-window cache may still take and roll back: it stays trimmable below its window."""
    if isinstance(c, RotatingKVCache | BatchRotatingKVCache):
        return max(0, int(c.max_size) - 1 - _held(c))
    return None


def trim_room(caches: Sequence[Any]) -> int | None:
    """How many positions a round may write and still trim them; None when no layer limits it."""
    rooms = [r for r in (_window_room(c) for c in caches) if r is not None]
    return min(rooms) if rooms else None


def _can_trim(c: Any, n: int) -> bool:
    if n > _held(c):
        return False
    if is_kvarn(c):
        return bool(c.can_trim(n))
    return trimmable(c)


def can_trim(caches: Sequence[Any], n: int) -> bool:
    return n <= 0 or all(_can_trim(c, n) for c in caches)


def trim(caches: Sequence[Any], n: int) -> bool:
    """Drop the newest n tokens from every layer. False, with nothing changed, when a layer cannot (a
    wrapped sliding window, a kvarn cache asked for more than its latest update, or fewer tokens held)."""
    if n <= 0:
        return True
    if not can_trim(caches, n):
        return False
    for c in caches:
        c.trim(n)
    return True
