"""Float16 KV caches (kv_dtype float16, engine/kv_half.py) on tiny random models: every buffer they allocate, grow,
batch, extend, filter, snapshot and restore stays float16 at half the fp32 bytes, and their logits stay within
float16 rounding of fp32 caches'. The kernels' reading of them is tests/unit/test_fast_ops.py's."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest
from mlx_vlm.models.cache import QuantizedKVCache

from gmlx_plan.memory import KVQuant
from gmlx_server.engine.arch import make_cache
from gmlx_server.engine.disk_files import kv_layout
from gmlx_server.engine.kv_half import (
    F16BatchKVCache,
    F16BatchRotatingKVCache,
    F16KVCache,
    F16RotatingKVCache,
    as_half,
    batch_half,
)
from gmlx_server.engine.kv_quant import CacheFactory
from gmlx_server.engine.kv_snapshot import restore, take
from tests.unit.test_cache_trim import PROMPT, _forward, _tiny


@pytest.fixture(scope="module")
def gemma() -> Any:
    return _tiny("gemma3")  # a sliding window of 8 beside full layers: both cache kinds


def _half_caches(model: Any) -> list[Any]:
    return [as_half(c) for c in make_cache(model)]


def _dtypes(caches: list[Any]) -> set[Any]:
    return {c.keys.dtype for c in caches} | {c.values.dtype for c in caches}


def test_half_caches_store_float16_and_stay_near_fp32(gemma: Any) -> None:
    half, fp32 = _half_caches(gemma), make_cache(gemma)
    assert {type(c) for c in half} == {F16KVCache, F16RotatingKVCache}
    for tokens in (PROMPT, [4], [9]):  # a prefill past the window, then decode steps (the rotating in-place path)
        got, want = _forward(gemma, half, tokens), _forward(gemma, fp32, tokens)
        assert _dtypes(half) == {mx.float16}
        assert float(mx.abs(got - want).max()) < 2e-2
    assert sum(c.nbytes for c in half) * 2 == sum(c.nbytes for c in fp32)


def test_batched_half_caches_stay_float16_and_match_each_row_alone(gemma: Any) -> None:
    a, b = _half_caches(gemma), _half_caches(gemma)
    _forward(gemma, a, PROMPT[:5])
    _forward(gemma, b, PROMPT[:3])
    batch = [batch_half(c) for c in a]
    assert {type(c) for c in batch} == {F16BatchKVCache, F16BatchRotatingKVCache}
    for mine, theirs in zip(batch, [batch_half(c) for c in b], strict=True):
        mine.extend(theirs)
    logits = gemma(mx.array([[7], [8]], dtype=mx.int32), cache=batch).logits
    mx.eval(logits, [c.state for c in batch])
    assert _dtypes(batch) == {mx.float16}
    alone = _forward(gemma, b, [8])
    assert float(mx.abs(logits[1] - alone[0]).max()) < 1e-3
    for c in batch:
        c.filter(mx.array([0]))
    _forward(gemma, batch, [3])
    assert _dtypes(batch) == {mx.float16}


def test_an_empty_row_does_not_promote_the_batch(gemma: Any) -> None:
    """mlx-vlm pads a row without keys with an fp32 empty array; the joined buffers stay float16."""
    full = _half_caches(gemma)
    _forward(gemma, full, PROMPT[:4])
    batch = [batch_half(c) for c in full]
    for c in batch:
        c.extend(F16BatchRotatingKVCache(c.max_size, [0]) if isinstance(c, F16BatchRotatingKVCache)
                 else F16BatchKVCache([0]))
    assert _dtypes(batch) == {mx.float16}


def test_a_float16_snapshot_restores_bit_for_bit(gemma: Any) -> None:
    factory = CacheFactory(lambda: make_cache(gemma), half=True)
    caches = factory()
    _forward(gemma, caches, PROMPT[:6])
    entry = take(caches, PROMPT[:6])
    assert entry is not None and {a.dtype for layer in entry.layers for a in layer[1]} == {mx.float16}
    restored = restore(entry, 6, factory)
    assert [type(c) for c in restored] == [type(c) for c in caches]
    assert mx.array_equal(_forward(gemma, restored, [11]), _forward(gemma, caches, [11]))


def test_the_factory_quantizes_first_and_halves_the_rest(gemma: Any) -> None:
    q = KVQuant("uniform", 8, 64)
    built = CacheFactory(lambda: make_cache(gemma), q, (False, True, False), half=True)()
    assert [type(c) for c in built] == [F16RotatingKVCache, QuantizedKVCache, F16RotatingKVCache]
    plain = CacheFactory(lambda: make_cache(gemma), q, (False, True, False))()
    assert isinstance(plain[1], QuantizedKVCache) and not any(isinstance(c, F16RotatingKVCache) for c in plain)


def test_the_disk_tier_keys_the_kv_dtype() -> None:
    """A float16 entry never matches a float32 model; float32 keeps the key files were written under before."""
    before = repr((None, "auto", None, None, True))
    assert kv_layout(None, "auto", None, None, True) == kv_layout(None, "auto", None, None, True, "float32") == before
    assert kv_layout(None, "auto", None, None, True, "float16") != before
