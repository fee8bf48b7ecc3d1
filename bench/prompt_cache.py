"""TTFT per turn of a growing 10-turn conversation, with the prompt cache on and off.

    .venv/bin/python bench/prompt_cache.py [--model smollm2|gemma] [--turns 10] [--gen 24]
    .venv/bin/python bench/prompt_cache.py --attention   # what a warm turn's remaining prefill costs

Like an agent harness: a long system prompt (tool descriptions), then each turn adds a short tool
result and the model's greedy answer, so the context grows to a few thousand tokens; a warm turn
prefills only what is new since the previous turn. Both engines are loaded side by side and every
turn runs cold, then warm, on the same prompt (with the anchor and boundaries the server would pass),
so both see the same machine load; `same` says whether the warm answer equals the cold one.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.blas_first  # noqa: F401  (OpenBLAS before mlx is first imported)

# isort: split
import mlx.core as mx

from gmlx_server.engine.arch import make_cache
from gmlx_server.engine.loader import load_gguf_model
from gmlx_server.engine.mlx_engine import MLXEngine
from gmlx_server.engine.types import GenerationRequest, SamplingParams, TokenEvent
from gmlx_server.serving.cache_points import cache_hints
from tests.conftest import gemma_path, smollm2_path

SYSTEM = "You are an agent with these tools. " + " ".join(
    f"Tool t{i}(path, mode) reads station {i} logs and returns the sensor readings as a table." for i in range(90))


def _user(turn: int) -> str:
    facts = " ".join(f"Item {turn}.{i}: station {i * 7 % 13} read {i * 3 + turn} units." for i in range(8))
    return f"Tool result {turn}: {facts} What next?"


def _turn(engine: MLXEngine, req: GenerationRequest) -> tuple[str, float, int]:
    async def go() -> list[TokenEvent]:
        return [ev async for ev in engine.submit(req)]

    events = asyncio.run(go())
    t = events[-1].timings
    assert t is not None and t.ttft_s is not None
    return "".join(e.text for e in events), t.ttft_s, t.cached_tokens


def _request(engine: MLXEngine, messages: list[dict[str, Any]], gen: int, rid: str) -> GenerationRequest:
    def encode(text: str) -> list[int]:
        ids: list[int] = engine.tokenizer.encode(text, add_special_tokens=False)
        return ids

    ids = encode(engine.template.render(messages))
    hints = cache_hints(messages, engine.template.render, encode, ids, shared_prefix=True,
                        window=engine.info.sliding_window)
    return GenerationRequest(rid, ids, gen, SamplingParams(temperature=0.0), **hints)


def conversation(path: str, turns: int, gen: int) -> list[tuple[int, float, float, int, bool]]:
    """Per turn: prompt tokens, cold TTFT, warm TTFT, warm tokens, and whether the answers agree."""
    cold = MLXEngine(lambda: load_gguf_model(path), prompt_cache_bytes=0)
    warm = MLXEngine(lambda: load_gguf_model(path), prompt_cache_bytes=512 << 20)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    out = []
    try:
        for turn in range(turns):
            messages.append({"role": "user", "content": _user(turn)})
            req = _request(warm, messages, gen, f"t{turn}")
            answer, c, _ = _turn(cold, req)
            again, w, k = _turn(warm, req)
            messages.append({"role": "assistant", "content": answer})
            out.append((len(req.prompt_tokens), c, w, k, again == answer))
            print(f"  turn {turn}: {len(req.prompt_tokens)} tokens, cold {c:.3f}s, warm {w:.3f}s ({k} cached)",
                  file=sys.stderr, flush=True)
    finally:
        cold.close()
        warm.close()
    return out


def attention_cost(path: str, context: int, new: int) -> tuple[float, float]:
    """Seconds to prefill `new` tokens on an empty cache, and on `context` cached tokens (a warm turn)."""
    model = load_gguf_model(path).model
    ids = mx.array([[100 + i * 7919 % 20000 for i in range(context + new)]], dtype=mx.int32)

    def prefill(cache: list[Any], start: int, end: int) -> float:
        t = time.perf_counter()
        for s in range(start, end, 512):
            logits = model(ids[:, s: min(s + 512, end)], cache=cache).logits
            mx.eval(logits, [c.state for c in cache])
        return time.perf_counter() - t

    empty = prefill(make_cache(model), context, context + new)
    cache = make_cache(model)
    prefill(cache, 0, context)
    return empty, prefill(cache, context, context + new)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("smollm2", "gemma"), default="smollm2")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--gen", type=int, default=24)
    ap.add_argument("--attention", action="store_true", help="time 160 new tokens on 0 and 3400 cached ones")
    a = ap.parse_args()
    path = smollm2_path() if a.model == "smollm2" else gemma_path()
    if a.attention:
        empty, warm = attention_cost(path, 3400, 160)
        print(f"160 new tokens: {empty:.3f}s on an empty cache, {warm:.3f}s on 3400 cached tokens")
        return
    rows = conversation(path, a.turns, a.gen)
    print(f"{'turn':>4} {'prompt':>7} {'cold_ttft_s':>12} {'warm_ttft_s':>12} {'warm_tok':>9} {'ratio':>6} same")
    for i, (n, c, w, k, same) in enumerate(rows):
        print(f"{i:>4} {n:>7} {c:>12.3f} {w:>12.3f} {k:>9} {w / c:>6.3f} {'yes' if same else 'no'}")


if __name__ == "__main__":
    main()
