"""Quantized KV caches on random tensors: kvarn attention against a float reference over the same
dequantized keys, batched rows against the same rows alone, snapshots, and the per-layer report."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest
from mlx_vlm.models.base import quantized_scaled_dot_product_attention
from mlx_vlm.models.cache import BatchKVCache, KVCache, QuantizedKVCache, RotatingKVCache

from gmlx_plan.geometry import Geometry, LayerKV
from gmlx_plan.memory import KVQuant, quantized_layers
from gmlx_server.engine.attention import cpu_attention
from gmlx_server.engine.kv_quant import (
    BatchKVarnCache,
    CacheFactory,
    KVarnCache,
    as_batch_quantized,
    kvarn_attention,
)
from gmlx_server.engine.kv_snapshot import restore, take

HK, H, D, SCALE = 2, 6, 64, 0.125


def _deq(x: mx.array, bits: int) -> mx.array:
    if not x.shape[2]:
        return x
    return mx.dequantize(*mx.quantize(x, group_size=64, bits=bits), group_size=64, bits=bits)


def _uniform(q: mx.array, keys: Any, values: Any, mask: Any, bits: int) -> mx.array:
    """mlx-vlm's quantized attention (it scales its queries argument in place: give it a copy)."""
    return quantized_scaled_dot_product_attention(q + 0, keys, values, SCALE, mask, 64, bits)


def _kv(n: int, rows: int = 1) -> tuple[mx.array, mx.array]:
    return mx.random.normal((rows, HK, n, D)), mx.random.normal((rows, HK, n, D))


@pytest.mark.parametrize("tail", [0, 5, 64])
def test_kvarn_attention_equals_float_attention_over_its_keys(tail: int) -> None:
    """Keys at 4 bits, values at 2, the newest `tail` exact: chunks and single steps, each checked."""
    mx.random.seed(tail)
    cache, ks, vs = KVarnCache(4, 2, 64, tail), [], []
    for n in (7, 1, 1, 12, 1, 30):
        k, v = _kv(n)
        q = mx.random.normal((1, H, n, D))
        ks.append(k)
        vs.append(v)
        mask = "causal" if n > 1 else None
        out = kvarn_attention(q, *cache.update_and_fetch(k, v), cache, SCALE, mask)
        K, V = mx.concatenate(ks, 2), mx.concatenate(vs, 2)
        cut = K.shape[2] - min(K.shape[2], tail)
        assert (cache.ks.used, cache.flen, cache.offset) == (cut, K.shape[2] - cut, K.shape[2])
        ref = cpu_attention(q, mx.concatenate([_deq(K[:, :, :cut], 4), K[:, :, cut:]], 2),
                            mx.concatenate([_deq(V[:, :, :cut], 2), V[:, :, cut:]], 2), SCALE, mask)
        assert float(mx.abs(out - ref).max()) < 1e-4


def test_kvarn_without_a_tail_is_mlx_vlm_uniform() -> None:
    mx.random.seed(1)
    ours, theirs = KVarnCache(4, 4, 64, 0), QuantizedKVCache(64, 4)
    k, v = _kv(9)
    q = mx.random.normal((1, H, 9, D))
    a = kvarn_attention(q, *ours.update_and_fetch(k, v), ours, SCALE, "causal")
    b = _uniform(q, *theirs.update_and_fetch(k, v), "causal", 4)
    assert mx.array_equal(a, b)


def _filled(cache: Any, n: int) -> Any:
    for s in range(0, n, 16):
        cache.update_and_fetch(*_kv(min(16, n - s)))
    return cache


@pytest.mark.parametrize("kind", ["kvarn", "uniform"])
def test_a_batch_decodes_each_row_as_it_would_alone(kind: str) -> None:
    """Rows shorter and longer than the tail join one left-padded batch; one step's attention per row equals
    that row's alone, before and after rows leave (the padding columns shift out)."""
    mx.random.seed(2)

    def make() -> Any:
        return KVarnCache(4, 8, 64, 20) if kind == "kvarn" else QuantizedKVCache(64, 4)

    lengths = [50, 9, 33, 3]
    alone = [_filled(make(), n) for n in lengths]
    snaps = [take([c], list(range(n))) for c, n in zip(alone, lengths, strict=True)]
    batch = None
    for c in alone:  # the batch gets copies: restore from the snapshots
        entry = snaps[alone.index(c)]
        assert entry is not None
        row = as_batch_quantized(restore(entry, len(entry.tokens), lambda: [make()])[0])
        batch = row if batch is None else (batch.extend(row) or batch)
    fp = BatchKVCache.merge([_filled(KVCache(), n) for n in lengths])  # a plain layer of the same rows
    _step_matches(batch, alone, fp)
    keep = mx.array([1, 3])
    batch.filter(keep)
    fp.filter(keep)
    _step_matches(batch, [alone[1], alone[3]], fp)


def _step_matches(batch: Any, alone: list[Any], fp: BatchKVCache) -> None:
    rows = len(alone)
    k, v = _kv(1, rows)
    q = mx.random.normal((rows, H, 1, D))
    mask = batch.make_mask(1)
    assert mx.array_equal(mask, fp.make_mask(1))  # the plain layer's mask fits the quantized one
    fp.update_and_fetch(k, v)
    keys, values = batch.update_and_fetch(k, v)
    if isinstance(batch, BatchKVarnCache):
        out = kvarn_attention(q, keys, values, batch, SCALE, mask)
    else:
        out = _uniform(q, keys, values, mask, batch.bits)
    for i, c in enumerate(alone):
        kk, vv = c.update_and_fetch(k[i: i + 1], v[i: i + 1])
        one = (kvarn_attention(q[i: i + 1], kk, vv, c, SCALE, None) if isinstance(c, KVarnCache) else
               _uniform(q[i: i + 1], kk, vv, None, c.bits))
        assert float(mx.abs(out[i: i + 1] - one).max()) < 1e-5, i


@pytest.mark.parametrize("kind", ["kvarn", "uniform"])
def test_snapshots_restore_exactly_and_cut_back(kind: str) -> None:
    """Stored packed: a restore holds the very values (no re-quantizing), cut to any shorter prefix, and the
    source's later writes never reach the snapshot."""
    mx.random.seed(3)

    def make() -> list[Any]:
        return [KVarnCache(4, 2, 64, 10) if kind == "kvarn" else QuantizedKVCache(64, 8)]

    cache = make()
    _filled(cache[0], 40)
    entry = take(cache, list(range(40)))
    assert entry is not None and entry.trimmable and entry.nbytes < 40 * HK * D * 4 * 2
    whole = _values(cache[0])
    cache[0].update_and_fetch(*_kv(1))  # a later write to the source
    for n in (40, 35, 12):
        back = restore(entry, n, make)[0]
        assert back.offset == n and mx.array_equal(_values(back), whole[:, :, :n])
    assert take(cache, list(range(40))) is None  # a cache that does not hold exactly the tokens is not taken


def _values(c: Any) -> mx.array:
    """Every key the cache holds, dequantized, oldest first."""
    if isinstance(c, KVarnCache):
        parts = [_deq_parts(c.ks.view(), 4)] if c.ks.used else []
        return mx.concatenate([*parts, *([c.fk] if c.fk is not None else [])], axis=2)
    return _deq_parts(c.state[0], c.bits)


def _deq_parts(parts: Any, bits: int) -> mx.array:
    return mx.dequantize(*parts, group_size=64, bits=bits)


def test_the_factory_quantizes_what_the_planner_counts() -> None:
    g = Geometry("gemma3", 4, 256, 512, 100, 4096,
                 (LayerKV(1, 64, 64, 512), LayerKV(1, 64, 64, None), LayerKV(1, 64, 64, 512), LayerKV(1, 64, 64, None)))

    def base() -> list[Any]:
        return [RotatingKVCache(512), KVCache(), RotatingKVCache(512), KVCache()]

    for q, verdict, done in ((KVQuant("uniform", 8, 64), "partial", 2), (KVQuant("uniform", 4, 128), "dropped", 0),
                             (KVQuant("kvarn", 4, 64, 2, 16), "partial", 2)):
        factory = CacheFactory(base, q, quantized_layers(g, q))
        report = factory.report()
        assert report is not None and (report.verdict, report.layers_quantized, report.layers_fp16) == (verdict, done,
                                                                                                       4 - done)
        assert report.verdict_batched == verdict
    full = Geometry("llama", 4, 256, 512, 100, 4096, (LayerKV(1, 64, 64, None),) * 3)
    q = KVQuant("kvarn", 4, 32, 8, 0)
    report = CacheFactory(lambda: [KVCache() for _ in range(3)], q, quantized_layers(full, q)).report()
    assert report is not None and report.verdict == "full" and report.value_bits == 8
    assert CacheFactory(base).report() is None and len(CacheFactory(base)()) == 4
