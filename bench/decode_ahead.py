"""Decode through the engine with the next step queued ahead (the default) and with every step settled first.

    .venv/bin/python bench/decode_ahead.py [--models smollm2,gemma,qwen0.5b] [--gen 128] [--runs 4]

One engine per model decodes the same chat prompt greedily (EOS barred, so every run makes `--gen` tokens),
alternating the two loops run by run so the machine's drift hits both alike: "ahead" builds step n+1's graph
on step n's tokens while they are still on the device (BatchDecoder.step(ahead=True), what the scheduler does
when nothing waits to join); "settled" evaluates each step and accepts its tokens before building the next.
Prints each loop's best decode tok/s and the ratio.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.blas_first  # noqa: F401  (OpenBLAS before mlx is first imported)

# isort: split
from bench.engine import PATHS, _one
from gmlx_server.engine import batch
from gmlx_server.engine.loader import load_gguf_model
from gmlx_server.engine.mlx_engine import MLXEngine

MESSAGES = [{"role": "user", "content": "Write a long story about a lighthouse keeper and the sea."}]
QUEUES_AHEAD = batch.BatchDecoder._queues_ahead


def _settled(self: batch.BatchDecoder, plans: list[batch._Plan]) -> bool:
    return False


def compare(name: str, gen: int, runs: int) -> None:
    engine = MLXEngine(lambda: load_gguf_model(PATHS[name](), name))
    try:
        ids = engine.tokenizer.encode(engine.template.render(MESSAGES, add_generation_prompt=True),
                                      add_special_tokens=False)
        _one(engine, ids, 8, "warm")
        best = {"ahead": 0.0, "settled": 0.0}
        for i in range(2 * runs):
            mode = "ahead" if i % 2 else "settled"
            # the bench's switch: the scheduler queues ahead whenever it may (no config key turns it off)
            batch.BatchDecoder._queues_ahead = QUEUES_AHEAD if mode == "ahead" else _settled  # type: ignore[method-assign]
            best[mode] = max(best[mode], _one(engine, ids, gen, f"{mode}{i}")[1])
        batch.BatchDecoder._queues_ahead = QUEUES_AHEAD  # type: ignore[method-assign]
        print(f"{name:8s} decode {gen} tokens, best of {runs}: settled {best['settled']:6.1f} tok/s, "
              f"ahead {best['ahead']:6.1f} tok/s -> {best['ahead'] / best['settled']:.2f}x")
    finally:
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,gemma,qwen0.5b")
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--runs", type=int, default=4)
    args = ap.parse_args()
    for name in args.models.split(","):
        compare(name, args.gen, args.runs)


if __name__ == "__main__":
    main()
