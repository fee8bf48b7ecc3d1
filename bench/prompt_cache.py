"""TTFT per turn of a growing 10-turn conversation, with the prompt cache on and off.

    .venv/bin/python bench/prompt_cache.py [--model smollm2|gemma] [--turns 10] [--gen 24]

Like an agent harness: a long system prompt (tool descriptions), then each turn adds a short tool
result and the model's greedy answer, so the context grows to a few thousand tokens; a warm turn
prefills only what is new since the previous turn.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gmlx_server.engine  # noqa: F401  (OpenBLAS before mlx)
from gmlx_server.engine.loader import load_gguf_model
from gmlx_server.engine.mlx_engine import MLXEngine
from gmlx_server.engine.types import GenerationRequest, SamplingParams, TokenEvent
from tests.conftest import gemma_path, smollm2_path

SYSTEM = "You are an agent with these tools. " + " ".join(
    f"Tool t{i}(path, mode) reads station {i} logs and returns the sensor readings as a table." for i in range(90))


def _user(turn: int) -> str:
    facts = " ".join(f"Item {turn}.{i}: station {i * 7 % 13} read {i * 3 + turn} units." for i in range(8))
    return f"Tool result {turn}: {facts} What next?"


def _turn(engine: MLXEngine, ids: list[int], gen: int, rid: str) -> tuple[str, float, int]:
    async def go() -> list[TokenEvent]:
        req = GenerationRequest(rid, ids, gen, SamplingParams(temperature=0.0))
        return [ev async for ev in engine.submit(req)]

    events = asyncio.run(go())
    t = events[-1].timings
    assert t is not None and t.ttft_s is not None
    return "".join(e.text for e in events), t.ttft_s, t.cached_tokens


def conversation(path: str, cache_bytes: int, turns: int, gen: int) -> list[tuple[int, float, int]]:
    engine = MLXEngine(lambda: load_gguf_model(path), prompt_cache_bytes=cache_bytes)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    out = []
    try:
        for turn in range(turns):
            messages.append({"role": "user", "content": _user(turn)})
            ids = engine.tokenizer.encode(engine.template.render(messages), add_special_tokens=False)
            answer, ttft, warm = _turn(engine, ids, gen, f"t{turn}")
            messages.append({"role": "assistant", "content": answer})
            out.append((len(ids), ttft, warm))
            print(f"  turn {turn}: {len(ids)} tokens, ttft {ttft:.3f}s, warm {warm}", file=sys.stderr, flush=True)
    finally:
        engine.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("smollm2", "gemma"), default="smollm2")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--gen", type=int, default=24)
    a = ap.parse_args()
    path = smollm2_path() if a.model == "smollm2" else gemma_path()
    cold = conversation(path, 0, a.turns, a.gen)
    warm = conversation(path, 512 << 20, a.turns, a.gen)
    print(f"{'turn':>4} {'prompt':>7} {'cold_ttft_s':>12} {'warm_ttft_s':>12} {'warm_tok':>9} {'ratio':>6}")
    for i, ((n, c, _), (n2, w, k)) in enumerate(zip(cold, warm, strict=True)):
        print(f"{i:>4} {n2:>7} {c:>12.3f} {w:>12.3f} {k:>9} {w / c:>6.2f}" + ("" if n == n2 else "  (prompts differ)"))


if __name__ == "__main__":
    main()
