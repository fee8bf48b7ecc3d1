"""Snapshots of real mlx-vlm caches: a restore equals the original, and later writes never reach a snapshot."""

from __future__ import annotations

import mlx.core as mx
from mlx_vlm.models.cache import KVCache, RotatingKVCache

from gmlx_server.engine.kv_snapshot import has_window, restore, take


def _fill(cache: list[object], n: int) -> None:
    for c in cache:
        kv = mx.arange(n * 4, dtype=mx.float32).reshape(1, 1, n, 4)
        c.update_and_fetch(kv, kv + 1)  # type: ignore[attr-defined]


def _make() -> list[object]:
    return [KVCache(), RotatingKVCache(max_size=8)]


def test_restore_equals_the_source_and_survives_later_writes() -> None:
    cache = _make()
    _fill(cache, 6)
    entry = take(cache, list(range(6)))
    assert entry is not None and entry.trimmable and has_window(cache) and entry.nbytes == 2 * 2 * 6 * 4 * 4
    back = restore(entry, 6, _make)
    for a, b in zip(cache, back, strict=True):
        assert mx.array_equal(a.state[0], b.state[0]) and b.offset == 6  # type: ignore[attr-defined]
    _fill(back, 1)  # a one-token step writes in place: it must not touch the snapshot
    assert entry.layers[0][1][0].shape[2] == 6 and back[0].offset == 7  # type: ignore[attr-defined]
    cut = restore(entry, 3, _make)
    assert [c.offset for c in cut] == [3, 3]  # type: ignore[attr-defined]
    assert mx.array_equal(cut[1].state[0], entry.layers[1][1][0][..., :3, :])  # type: ignore[attr-defined]


def test_past_the_window_a_snapshot_is_not_trimmable() -> None:
    cache = _make()
    _fill(cache, 10)
    entry = take(cache, list(range(10)))
    assert entry is not None and not entry.trimmable
    back = restore(entry, 10, _make)
    assert back[1].meta_state == cache[1].meta_state  # type: ignore[attr-defined]


def test_a_cache_that_does_not_hold_the_tokens_is_not_taken() -> None:
    cache = _make()
    _fill(cache, 4)
    assert take(cache, list(range(5))) is None
