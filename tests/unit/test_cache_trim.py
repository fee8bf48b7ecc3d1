"""Trimming a KV cache after a speculative round: tiny random models (qwen2: full attention only; gemma3: a
sliding window of 8 beside full layers) run real forward passes, and after `trim` the next pass's logits
equal those of a cache that never saw the rejected tokens, for every cache type the engine builds, one
stream's and the batch forms. A wrapped window and an over-long kvarn trim are refused, changing nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import pytest
from mlx.utils import tree_map
from mlx_vlm.models.cache import BatchKVCache, BatchRotatingKVCache, KVCache, QuantizedKVCache, RotatingKVCache

from gmlx_server.engine.arch import ARCHS, make_cache
from gmlx_server.engine.attention import use_gmlx_attention
from gmlx_server.engine.cache_trim import can_trim, trim, trim_room
from gmlx_server.engine.kv_half import as_half, batch_half
from gmlx_server.engine.kv_quant import BatchKVarnCache, KVarnCache, as_batch_quantized, kvarn_attention

VOCAB, WINDOW = 97, 8
PROMPT = [5, 17, 3, 88, 41, 9, 60, 2, 33, 71]
ROUND = [12, 45, 7, 90]  # the k + 1 positions a round writes (the last input and three drafts)
NEXT = [23, 64, 8]


def _tiny(arch: str) -> Any:
    spec = ARCHS[arch]
    params: dict[str, Any] = {
        "model_type": "qwen2", "hidden_size": 128, "num_hidden_layers": 3, "intermediate_size": 256,
        "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-6, "vocab_size": VOCAB,
        "max_position_embeddings": 4096, "head_dim": 64, "tie_word_embeddings": True, "rope_theta": 10000.0}
    if arch == "gemma3":
        params |= {"model_type": "gemma3_text", "sliding_window": WINDOW, "sliding_window_pattern": 2,
                   "query_pre_attn_scalar": 64.0, "rope_global_base_freq": 1e6, "rope_local_base_freq": 1e4}
    model = spec.model_class()(spec.make_config(params))
    mx.random.seed(7)
    model.update(tree_map(lambda a: mx.random.normal(a.shape) * 0.2, model.parameters()))
    use_gmlx_attention(model, cpu=True)  # as the loader does: kvarn caches need gmlx's attention
    return model


@pytest.fixture(scope="module")
def models() -> dict[str, Any]:
    return {"qwen2": _tiny("qwen2"), "gemma3": _tiny("gemma3")}


def _quantize(kind: str) -> Callable[[Any], Any]:
    """Full-attention layers as the cache factory builds them for `kind` (sliding ones stay rotating)."""
    def build(c: Any) -> Any:
        if kind == "half":  # kv_dtype float16: plain and sliding layers alike
            return as_half(c)
        if type(c) is not KVCache or kind == "plain":
            return c
        return QuantizedKVCache(group_size=64, bits=8) if kind == "uniform" else KVarnCache(4, 8, 64, int(kind[5:]))
    return build


def _batch(c: Any) -> Any:
    """The batch form the decoder merges a prefilled row into."""
    quantized = as_batch_quantized(c)
    if quantized is not None:
        return quantized
    half = batch_half(c)
    if half is not None:
        return half
    return BatchRotatingKVCache.merge([c]) if isinstance(c, RotatingKVCache) else BatchKVCache.merge([c])


def _caches(model: Any, kind: str, batched: bool, prompt: list[int]) -> list[Any]:
    caches = [_quantize(kind)(c) for c in make_cache(model)]
    _forward(model, caches, prompt)
    return [_batch(c) for c in caches] if batched else caches


def _forward(model: Any, caches: list[Any], tokens: list[int]) -> mx.array:
    logits: mx.array = model(mx.array([tokens], dtype=mx.int32), cache=caches).logits
    mx.eval(logits, [c.state for c in caches])
    return logits


# kvarn with a tail shorter than a pass moves tokens into its quantized store mid-pass, so a pass's attention
# depends on how many tokens it writes (test_kvarn_trim_restores_the_state checks its trim on the state).
KINDS = ["plain", "half", "uniform", "kvarn0", "kvarn64"]


@pytest.mark.parametrize("batched", [False, True], ids=["one-stream", "batch-form"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_a_trimmed_cache_equals_one_that_never_saw_the_tokens(models: dict[str, Any], arch: str, kind: str,
                                                               batched: bool) -> None:
    model, prompt = models[arch], PROMPT if arch == "qwen2" else PROMPT[:3]  # gemma3: the round stays in its window
    for rejected in (1, 3, len(ROUND)):  # some drafts kept, none kept, even the round's first input dropped
        kept = ROUND[: len(ROUND) - rejected]
        spec = _caches(model, kind, batched, prompt)
        _forward(model, spec, ROUND)
        assert trim(spec, rejected)
        ref = _caches(model, kind, batched, prompt)
        if kept:
            _forward(model, ref, kept)
        for tokens in ([NEXT[0]], NEXT):  # a decode step, then a pass of several (the next round's verify)
            got, want = _forward(model, spec, tokens), _forward(model, ref, tokens)
            assert float(mx.abs(got - want).max()) < 1e-4, (arch, kind, batched, rejected)


@pytest.mark.parametrize("kind", ["plain", "kvarn0"])
def test_an_untrimmed_cache_differs(models: dict[str, Any], kind: str) -> None:
    """The comparison above can fail: keeping the rejected tokens changes the next logits."""
    model = models["qwen2"]
    spec, ref = _caches(model, kind, False, PROMPT), _caches(model, kind, False, PROMPT)
    _forward(model, spec, ROUND)
    _forward(model, ref, ROUND[:1])
    assert float(mx.abs(_forward(model, spec, NEXT) - _forward(model, ref, NEXT)).max()) > 1e-2


def test_rounds_repeat(models: dict[str, Any]) -> None:
    """Write, trim, write, trim: the cache keeps matching one fed only the kept tokens."""
    model = models["gemma3"]
    spec, ref = _caches(model, "uniform", True, PROMPT[:1]), _caches(model, "uniform", True, PROMPT[:1])
    for start in range(3):
        drafts = [(start * 11 + i) % VOCAB for i in range(3)]
        _forward(model, spec, drafts)
        assert trim(spec, 2)
        _forward(model, ref, drafts[:1])
    assert float(mx.abs(_forward(model, spec, NEXT) - _forward(model, ref, NEXT)).max()) < 1e-4


@pytest.mark.parametrize("batched", [False, True], ids=["one-stream", "batch-form"])
def test_a_wrapped_window_cannot_be_trimmed(models: dict[str, Any], batched: bool) -> None:
    """The gemma3 model's window is 8 tokens: room shrinks as the prompt grows, and once a round's writes
    reach the window, trim refuses and leaves every layer as it was."""
    model = models["gemma3"]
    caches = _caches(model, "plain", batched, PROMPT[:3])
    assert trim_room(caches) == WINDOW - 1 - 3 and trim_room(_caches(models["qwen2"], "plain", batched, PROMPT)) is None
    _forward(model, caches, ROUND)  # 7 tokens: still inside the window
    assert trim_room(caches) == 0 and can_trim(caches, 2)
    _forward(model, caches, [1])  # 8: the window is full
    before = _positions(caches)
    assert not can_trim(caches, 1) and not trim(caches, 1)
    assert _positions(caches) == before


def _positions(caches: list[Any]) -> list[tuple[Any, ...]]:
    return [(mx.array(c.offset).tolist(), getattr(c, "_idx", None), getattr(c, "_offset", None)) for c in caches]


def test_kvarn_takes_back_only_its_latest_update(models: dict[str, Any]) -> None:
    model = models["qwen2"]
    caches = _caches(model, "kvarn3", False, PROMPT)
    _forward(model, caches, ROUND[:2])
    assert not trim(caches, 3)  # older than the latest update: its exact values are gone
    assert [c.offset for c in caches] == [len(PROMPT) + 2] * 3
    assert trim(caches, 2) and not can_trim(caches, 1)  # one trim per update
    assert [c.offset for c in caches] == [len(PROMPT)] * 3


def test_more_than_held_is_refused(models: dict[str, Any]) -> None:
    caches = _caches(models["qwen2"], "plain", True, PROMPT[:2])
    assert not trim(caches, 3) and trim(caches, 0)


def _kv(n: int, rows: int) -> tuple[mx.array, mx.array]:
    return mx.random.normal((rows, 2, n, 64)), mx.random.normal((rows, 2, n, 64))


def _kvarn(tail: int, rows: int) -> Any:
    return KVarnCache(4, 2, 64, tail) if rows == 1 else BatchKVarnCache(4, 2, 64, tail, [0] * rows)


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("tail", [0, 2, 3, 5, 9])
def test_kvarn_trim_restores_the_state(tail: int, rows: int) -> None:
    """Tails shorter, equal and longer than the round: after trim the quantized store and the unquantized tail
    are bit for bit those of a cache fed only the kept tokens, and attention over both agrees exactly."""
    mx.random.seed(tail)
    prompt, round_ = _kv(7, rows), _kv(4, rows)
    for rejected in range(1, 5):
        spec, ref = _kvarn(tail, rows), _kvarn(tail, rows)
        spec.update_and_fetch(*prompt)
        spec.update_and_fetch(*round_)
        spec.trim(rejected)
        ref.update_and_fetch(*prompt)
        if rejected < 4:
            ref.update_and_fetch(*(x[:, :, : 4 - rejected] for x in round_))
        assert (spec.ks.used, spec.flen) == (ref.ks.used, ref.flen)
        assert all(mx.array_equal(a, b).item() for a, b in zip(spec.arrays(), ref.arrays(), strict=True))
        assert mx.array_equal(mx.array(spec.offset), mx.array(ref.offset)).item()
        q, step = mx.random.normal((rows, 6, 1, 64)), _kv(1, rows)
        got, want = (_attend(q, c, step) for c in (spec, ref))
        assert mx.array_equal(got, want).item()


def _attend(q: mx.array, cache: Any, step: tuple[mx.array, mx.array]) -> mx.array:
    keys, values = cache.update_and_fetch(*step)
    return kvarn_attention(q, keys, values, cache, 0.125, None)
