"""The prompt cache on the real models: greedy output with a cache hit equals the output without one,
on the engine and through the HTTP API (where the server places the anchor and message checkpoints)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest

from gmlx_server.engine.loader import load_gguf_model
from gmlx_server.engine.mlx_engine import MLXEngine
from gmlx_server.engine.types import GenerationRequest, SamplingParams, TokenEvent
from tests.conftest import gemma_path, smollm2_path
from tests.e2e.server import LiveServer, gmlx_serve

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(temperature=0.0)
N = 12


def _run(engine: MLXEngine, ids: Sequence[int], boundaries: Sequence[int] = ()) -> tuple[list[int], int]:
    """Greedy token ids and the prompt tokens the cache supplied."""
    async def go() -> list[TokenEvent]:
        req = GenerationRequest("r", list(ids), N, GREEDY, cache_boundaries=tuple(boundaries))
        return [ev async for ev in engine.submit(req)]

    events = asyncio.run(go())
    assert events[-1].timings is not None and events[-1].error is None
    return [e.token_id for e in events if e.token_id is not None], events[-1].timings.cached_tokens


def _hits(engine: MLXEngine) -> dict[str, int]:
    return dict(engine.cache_stats().hits)


def _reference(path: str, prompts: list[list[int]]) -> list[list[int]]:
    cold = MLXEngine(lambda: load_gguf_model(path), decode_batch=1)
    try:
        return [_run(cold, p)[0] for p in prompts]
    finally:
        cold.close()


def test_exact_and_block_hits_match_cold_smollm2() -> None:
    engine = MLXEngine(lambda: load_gguf_model(smollm2_path()), prompt_cache_bytes=256 << 20)
    try:
        text = "In a quiet village by the river, the baker rose before dawn to light the ovens. " * 12
        base = engine.tokenizer.encode(text)
        other = base[:200] + engine.tokenizer.encode(" Meanwhile, far away, a ship sailed north.",
                                                     add_special_tokens=False)
        ref = _reference(smollm2_path(), [base, other])
        assert _run(engine, base) == (ref[0], 0)
        assert _run(engine, base) == (ref[0], len(base) - 1)
        assert _hits(engine)["exact"] == 1
        toks, warm = _run(engine, other)
        assert toks == ref[1] and warm >= 192  # at least the three shared 64-token blocks
        assert _hits(engine)["block"] == 1
        stats = engine.cache_stats()
        assert stats.entries == 2 and 0 < stats.bytes <= stats.max_bytes
    finally:
        engine.close()


def test_exact_and_ckpt_hits_past_the_sliding_window_match_cold_gemma() -> None:
    engine = MLXEngine(lambda: load_gguf_model(gemma_path()), prompt_cache_bytes=256 << 20)
    try:
        long = engine.tokenizer.encode("The lighthouse keeper wrote in his log every night. " * 60)
        assert len(long) > 600
        grown = long + engine.tokenizer.encode(" One night the lamp went dark and", add_special_tokens=False)
        forked = long[:600] + engine.tokenizer.encode(" Years later, his daughter", add_special_tokens=False)
        ref = _reference(gemma_path(), [long, grown, forked])
        assert _run(engine, long, boundaries=[600]) == (ref[0], 0)
        assert _run(engine, long) == (ref[0], len(long) - 1)
        assert _hits(engine)["exact"] == 1
        assert _run(engine, grown) == (ref[1], len(long) - 1)  # the prompt-end snapshot as a prefix
        assert _run(engine, forked) == (ref[2], 600)  # the message-boundary checkpoint
        assert _hits(engine)["ckpt"] == 2
    finally:
        engine.close()


# --- through the HTTP API: the server computes the anchor and message boundaries itself -----------------

SYSTEM = "You are a lighthouse keeper's assistant. " + " ".join(
    f"Rule {i}: log the lamp, the weather and ship {i} at every watch." for i in range(45))  # past the window


def _chat(s: LiveServer, messages: list[dict[str, str]], model: str = "gemma") -> tuple[str, int]:
    r = httpx.post(s.v1 + "/chat/completions", timeout=600, json={
        "model": model, "messages": messages, "max_tokens": N, "temperature": 0})
    r.raise_for_status()
    body = r.json()
    return body["choices"][0]["message"]["content"], body["usage"]["prompt_tokens_details"]["cached_tokens"]


def _tier_of(s: LiveServer, messages: list[dict[str, str]], model: str = "gemma") -> tuple[str, str, int]:
    """(the tier this request hit, its greedy text, its cached tokens), from the stats' hit counts."""
    before = httpx.get(s.v1 + "/cache/stats").json().get("hits", {})  # {"enabled": false} before the load
    text, cached = _chat(s, messages, model)
    after = httpx.get(s.v1 + "/cache/stats").json()["hits"]
    hit = [t for t in after if after[t] > before.get(t, 0)]
    return (hit[0] if hit else "miss"), text, cached


def test_follow_up_turns_hit_ckpt_and_anchor_through_http_and_match_cold_gemma(tmp_path: Path) -> None:
    cfg = tmp_path / "gmlx.yaml"
    cfg.write_text(f"models:\n  gemma:\n    path: {gemma_path()}\n")
    with gmlx_serve(["--config", str(cfg)], tmp_path) as s:
        first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What happened at dawn?"}]
        tier, reply, _ = _tier_of(s, first)
        est = httpx.post(s.v1 + "/estimate", json={"model": "gemma", "messages": first}).json()
        assert tier == "miss" and est["cache_tier"] == "exact" and est["warm_tokens"] == est["prompt_tokens"] - 1
        turn = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "And at dusk?"}]
        edited = [*turn[:-1], {"role": "user", "content": "Which ship came in?"}]
        other = [first[0], {"role": "user", "content": "Describe the lamp."}]
        warm = [_tier_of(s, m) for m in (turn, edited, other)]
        # A follow-up restores the first prompt's snapshot; an edited last turn, the boundary saved before it;
        # a new conversation, the pinned system prefix.
        assert [w[0] for w in warm] == ["ckpt", "ckpt", "anchor"]
        assert warm[1][2] > warm[0][2] > warm[2][2] > 500
        cold = []
        for m in (turn, edited, other):
            httpx.post(s.v1 + "/cache/reset", json={}).raise_for_status()
            cold.append(_tier_of(s, m))
        assert [c[0] for c in cold] == ["miss"] * 3
        assert [w[1] for w in warm] == [c[1] for c in cold]  # greedy output identical with and without a hit


def test_anchor_and_prefix_hits_through_http_match_cold_smollm2(tmp_path: Path) -> None:
    """SmolLM2 has no sliding window: a follow-up reuses the stored prompt, a new conversation the anchor."""
    with gmlx_serve([], tmp_path) as s:
        def chat(m: list[dict[str, str]]) -> tuple[str, str, int]:
            return _tier_of(s, m, "smollm2")

        first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What happened at dawn?"}]
        assert chat(first)[0] == "miss"
        turn = [*first, {"role": "assistant", "content": "The lamp was lit."}, {"role": "user", "content": "Dusk?"}]
        other = [first[0], {"role": "user", "content": "Describe the lamp."}]
        warm = [chat(m) for m in (turn, other)]
        assert warm[0][0] != "miss" and warm[1][0] == "anchor" and warm[0][2] > warm[1][2] > 500
        cold = []
        for m in (turn, other):
            httpx.post(s.v1 + "/cache/reset", json={}).raise_for_status()
            cold.append(chat(m))
        assert [c[0] for c in cold] == ["miss"] * 2
        assert [w[1] for w in warm] == [c[1] for c in cold]  # greedy output identical with and without a hit


def test_a_closed_engine_with_a_prompt_cache_is_freed_by_reference_counting() -> None:
    """Unload relies on it (no gc.collect on the event loop): a closure over the engine in its cache tiers once
    kept every unloaded model's arrays until the cycle collector ran, and the next load was shed."""
    gc.disable()
    try:
        engine = MLXEngine(lambda: load_gguf_model(smollm2_path()), prompt_cache_bytes=1 << 20)
        alive = weakref.ref(engine)
        engine.close()
        del engine
        assert alive() is None
    finally:
        gc.enable()


def test_queued_rows_expect_the_warm_tokens_they_then_restore() -> None:
    """The drain replay's warm split: a row queued behind a prompt it shares a prefix with expects that prefix,
    and restores it once it starts (before, a queued row counted as cold whatever it shared)."""
    shared = list(range(1000, 1200))
    prompts = [[*shared, *range(2000 + 30 * i, 2020 + 30 * i)] for i in range(3)]
    engine = MLXEngine(lambda: load_gguf_model(smollm2_path()), decode_batch=1, prompt_cache_bytes=256 << 20)

    async def go() -> tuple[dict[str, int], list[int]]:
        handles = [engine.submit(GenerationRequest(f"r{i}", p, 4, GREEDY)) for i, p in enumerate(prompts)]
        expected = {r.request_id: r.expected_warm for r in engine.stats().rows if r.state == "queued"}
        cached = []
        for h in handles:
            last = [ev async for ev in h][-1]
            assert last.timings is not None and last.error is None
            cached.append(last.timings.cached_tokens)
        return expected, cached

    try:
        expected, cached = asyncio.run(go())
    finally:
        engine.close()
    assert expected["r1"] == expected["r2"] == 200 and expected.get("r0", 0) == 0  # width 1: r1 and r2 wait
    assert cached == [0, 200, 200]
