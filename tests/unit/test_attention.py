"""The CPU attention path against mx.fast.scaled_dot_product_attention: every mask mlx-vlm passes, the
fallbacks, and (slow) real models' logits and greedy tokens with and without it in their attention modules."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import pytest

from gmlx_server.engine import loader, vlm_adapter
from gmlx_server.engine.arch import make_cache
from gmlx_server.engine.attention import as_flat, cpu_attention, supported, use_gmlx_attention
from gmlx_server.engine.kernels import probe
from gmlx_server.engine.kernels.fast_ops import MLX_OPS, Primitives
from gmlx_server.engine.loader import load_gguf_model
from tests.conftest import gemma_path, smollm2_path

TOL = 1e-5


def _qkv(B: int, H: int, Hk: int, L: int, S: int, D: int) -> tuple[mx.array, mx.array, mx.array]:
    mx.random.seed(B * 1000 + H * 100 + L + S + D)
    # Keys sliced from a longer buffer, as KVCache hands them back; scores large enough to be peaked.
    kbuf, vbuf = mx.random.normal((B, Hk, S + 37, D)) * 2, mx.random.normal((B, Hk, S + 37, D))
    return mx.random.normal((B, H, L, D)) * 2, kbuf[..., :S, :], vbuf[..., :S, :]


def _check(q: mx.array, k: mx.array, v: mx.array, mask: Any) -> None:
    assert supported(q, k, None, mask, None)
    scale = q.shape[-1] ** -0.5  # as the models scale
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    got = cpu_attention(q, k, v, scale, mask)
    assert got.shape == want.shape
    assert mx.abs(got - want).max().item() < TOL
    B, H, L, Dv = want.shape
    for prims in (MLX_OPS, Primitives(probe().ext)):  # flat: (B, L, H * Dv), MLX's ops and the kernels' primitive
        flat = cpu_attention(q, k, v, scale, mask, prims, flat=True)
        assert flat.shape == (B, L, H * Dv)
        assert mx.array_equal(flat, as_flat(cpu_attention(q, k, v, scale, mask, prims)))


@pytest.mark.parametrize(("H", "Hk", "D"), [(9, 3, 64), (4, 1, 256), (4, 4, 32)])
@pytest.mark.parametrize(("L", "S"), [(1, 1), (1, 300), (7, 7), (16, 300)])
def test_matches_sdpa_unmasked_and_causal(H: int, Hk: int, D: int, L: int, S: int) -> None:
    q, k, v = _qkv(1, H, Hk, L, S, D)
    _check(q, k, v, None)
    _check(q, k, v, "causal")


def test_matches_sdpa_sliding_window_masks() -> None:
    q, k, v = _qkv(1, 4, 1, 12, 40, 64)
    rows, cols = mx.arange(28, 40)[:, None], mx.arange(40)[None]
    _check(q, k, v, (rows >= cols) & (rows < cols + 16))  # (L, S), as create_causal_mask with a window
    q1, k1, v1 = _qkv(1, 4, 1, 1, 40, 64)
    _check(q1, k1, v1, mx.roll(mx.arange(40) >= 8, 5))  # (S,), as RotatingKVCache's decode mask


def test_matches_sdpa_batched_left_padding_and_head_masks() -> None:
    q, k, v = _qkv(2, 9, 3, 5, 20, 64)
    pad = mx.array([0, 12])  # row 1's first 12 keys are padding: its first queries see no key at all
    allowed = (mx.arange(15, 20)[:, None] >= mx.arange(20)[None]) & (mx.arange(20)[None] >= pad[:, None, None])
    _check(q, k, v, allowed[:, None])  # (B, 1, L, S), as BatchKVCache
    per_head = mx.random.uniform(shape=(2, 9, 5, 20)) > 0.3
    _check(q, k, v, per_head)  # (B, H, L, S)
    _check(q, k, v, mx.where(allowed[:, None], 0.0, -1e9) + mx.random.normal((2, 9, 5, 20)))  # additive


def test_unsupported_inputs_keep_mlx_vlm_path() -> None:
    from mlx_vlm.models.cache import BatchQuantizedKVCache, QuantizedKVCache

    from gmlx_server.engine.kv_quant import KVarnCache

    q, k, _ = _qkv(1, 9, 3, 4, 10, 64)
    assert not supported(q, k, None, None, mx.zeros((9,)))  # sinks
    for quantized in (QuantizedKVCache(), BatchQuantizedKVCache([0]), KVarnCache(4, 4, 32, 8)):
        assert not supported(q, k, quantized, None, None)
    assert not supported(q.astype(mx.float16), k.astype(mx.float16), None, None, None)
    assert not supported(q, k, None, mx.ones((1, 4, 10), mx.bool_), None)  # 3-D: which axis is which?
    assert not supported(q, (k, k, k), None, None, None)


def test_a_models_attention_modules_call_gmlx_and_mlx_vlm_keeps_its_own() -> None:
    import mlx_vlm.models.qwen2.language as lang
    from mlx_vlm.models.base import scaled_dot_product_attention as original

    model = lang.LanguageModel(lang.ModelConfig.from_dict({
        "model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
        "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-6, "vocab_size": 50}))
    assert use_gmlx_attention(model, cpu=True) == 2
    assert use_gmlx_attention(model, cpu=True) == 0  # already gmlx's: not wrapped twice
    attn = model.model.layers[0].self_attn
    assert isinstance(attn, lang.Attention) and type(attn) is not lang.Attention
    assert lang.scaled_dot_product_attention is original  # the family's module is untouched
    other = lang.Attention(model.args)
    assert type(other) is lang.Attention  # and so is every instance of another model


# --- real models (slow): the model's own forward with mx.fast's attention, ours, and a float64 one ---

# Gemma 3's logits move by up to ~4e-4 for any change in attention rounding: mx.fast's own differ that much
# from a float64 attention's. So Gemma is held to 1e-3, and to being no farther from float64 than mx.fast.
# The matmuls run on fp32 activations meanwhile: the int16 ones (the prefill GEMM's 16383 levels) turn
# attention's last-bit differences into whole rounding steps, which then measure the matmuls, not attention.
LOGIT_TOL = {"smollm2": 1e-4, "gemma": 1e-3}


@pytest.fixture
def fp32_matmuls() -> Iterator[None]:
    ext = probe().ext
    if ext is None:  # no kernels: MLX's fp32 matmuls already
        yield
        return
    ext.set_activations("f32")
    try:
        yield
    finally:
        ext.set_activations("auto")


def _float64_attention(queries: mx.array, keys: Any, values: Any, cache: Any, scale: float, mask: Any,
                       sinks: Any = None) -> mx.array:
    f64 = [x.astype(mx.float64) for x in (queries, keys, values)]
    return cpu_attention(*f64, scale, mask).astype(queries.dtype)


@contextmanager
def _attention(model: Any, how: str) -> Iterator[None]:
    """how: "mx.fast" (mlx-vlm's own), "gmlx" (as loaded) or "float64": the loaded model's attention modules
    recast to their family's class, or to it calling the float64 attention, for the block."""
    ours = [m for _, m in model.named_modules() if vlm_adapter.calls_attention(type(m).__mro__[1])]
    loaded = type(ours[0])
    family = loaded.__mro__[1]
    cls = {"mx.fast": family, "gmlx": loaded, "float64": vlm_adapter.with_attention(family, _float64_attention)}[how]
    for m in ours:
        vlm_adapter.recast(m, cls)
    try:
        yield
    finally:
        for m in ours:
            vlm_adapter.recast(m, loaded)


def _logits_and_greedy(model: Any, ids: list[int], chunk: int, new: int) -> tuple[mx.array, list[int]]:
    """Chunked prefill through the model's caches (Gemma: rotating sliding-window ones), then greedy."""
    cache, rows = make_cache(model), []
    for s in range(0, len(ids), chunk):
        rows.append(model(mx.array([ids[s:s + chunk]]), cache=cache).logits[0])
    logits, out = mx.concatenate(rows), []
    nxt = int(mx.argmax(logits[-1]).item())
    for _ in range(new):
        out.append(nxt)
        nxt = int(mx.argmax(model(mx.array([[nxt]]), cache=cache).logits[0, -1]).item())
    return logits, out


def _runs(loaded: Any, ids: list[int]) -> dict[str, tuple[mx.array, list[int], mx.array | None]]:
    """Per attention: chunked logits, greedy ids, and (not for float64) logits of one uncached forward."""
    out = {}
    for how in ("mx.fast", "gmlx", "float64"):
        with _attention(loaded.model, how):
            logits, greedy = _logits_and_greedy(loaded.model, ids, 300, 12 if how != "float64" else 0)
            # No cache: Gemma's sliding layers then get an (L, L) window mask array.
            whole = loaded.model(mx.array([ids])).logits[0] if how != "float64" else None
        out[how] = (logits, greedy, whole)
    return out


def _rms(d: mx.array) -> float:
    return float(mx.sqrt(mx.mean(d * d)).item())


@pytest.mark.slow
@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_real_model_logits_and_greedy_unchanged(which: str, monkeypatch: pytest.MonkeyPatch,
                                                fp32_matmuls: None) -> None:
    # the family's own Attention forward around each attention function (test_heads_attention.py: the heads primitive)
    monkeypatch.setattr(loader, "use_heads_attention", lambda model, prims: 0)
    loaded = load_gguf_model(smollm2_path() if which == "smollm2" else gemma_path())
    assert type(loaded.model.model.layers[0].self_attn).__name__ == "GmlxAttention"  # the loader's, on the CPU
    text = " ".join(f"Line {i}: the pump at station {i % 11} read {i * 37 % 101} kPa." for i in range(60))
    ids = loaded.tokenizer.encode(text)[:700]
    assert len(ids) == 700 and (loaded.info.sliding_window or 0) < 700  # longer than Gemma's 512 window
    runs = _runs(loaded, ids)
    (fast, fast_ids, fast_whole), (ours, our_ids, our_whole), (f64, _, _) = runs.values()
    # against float64 the root mean square over every logit: the largest single difference swung 0.7x-2.3x of
    # mx.fast's on Gemma with nothing but the fp32 matmuls' summation order changed (a repacked layout's)
    diff = {"chunked": mx.abs(ours - fast).max().item(), "uncached": mx.abs(our_whole - fast_whole).max().item(),
            "mx.fast-f64": _rms(fast - f64), "gmlx-f64": _rms(ours - f64)}
    print(which, {k: f"{v:.1e}" for k, v in diff.items()})
    assert max(diff["chunked"], diff["uncached"]) < LOGIT_TOL[which]
    assert diff["gmlx-f64"] <= diff["mx.fast-f64"] * 1.5 + 1e-7
    assert our_ids == fast_ids
