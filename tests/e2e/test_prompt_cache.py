"""The prompt cache on the real models: greedy output with a cache hit equals the output without one."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from gmlx_server.engine.loader import load_gguf_model
from gmlx_server.engine.mlx_engine import MLXEngine
from gmlx_server.engine.types import GenerationRequest, SamplingParams, TokenEvent
from tests.conftest import gemma_path, smollm2_path

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
    return dict(engine.cache_stats()["hits"])


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
        assert stats["entries"] == 2 and 0 < stats["bytes"] <= stats["max_bytes"]
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
