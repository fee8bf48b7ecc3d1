"""What sampling costs a row per decode step on the CPU: mlx-vlm's top_p (a sort of the whole vocabulary) beside
gmlx's (a partition of the most probable tokens), and the whole sampler under each family's chat intent.

    .venv/bin/python bench/sampling.py [--models smollm2,gemma] [--reps 30]

The logits are the model's own after a short chat prompt, so the nucleus is as wide as a real one. Prints
medians in ms, and the nucleus size.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.blas_first  # OpenBLAS before mlx is first imported

# isort: split
import mlx.core as mx
import numpy as np
from mlx_vlm import sample_utils as su

from gmlx_server.engine.loader import load_gguf_model
from gmlx_server.engine.sampling import RequestSampler, top_p_filter
from gmlx_server.engine.types import SamplingParams
from tests.conftest import gemma_path, smollm2_path

PATHS = {"smollm2": smollm2_path, "gemma": gemma_path}
CHAT = {"smollm2": SamplingParams(temperature=0.7, top_p=0.9),  # serving/intents.py's chat rows
        "gemma": SamplingParams(temperature=1.0, top_p=0.95, top_k=64)}


def _median_ms(fn: Callable[[], mx.array], reps: int) -> float:
    mx.eval(fn())
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def bench(name: str, reps: int) -> None:
    lm = load_gguf_model(PATHS[name]())
    text = lm.template.render([{"role": "user", "content": "Write a short story about a lighthouse keeper."}])
    logits = lm.model(mx.array([lm.tokenizer.encode(text, False)]), cache=None).logits[:, -1, :].astype(mx.float32)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    mx.eval(lp)
    p = CHAT[name]
    nucleus = int(np.isfinite(np.array(top_p_filter(lp, p.top_p))).sum())
    theirs = _median_ms(lambda: su.apply_top_p(lp, p.top_p), reps)
    ours = _median_ms(lambda: top_p_filter(lp, p.top_p), reps)
    sampler = RequestSampler(p, [])
    whole = _median_ms(lambda: sampler(logits, None).token, reps)
    print(f"{name:8s} vocab {lp.shape[-1]:6d}  nucleus {nucleus:5d}  top_p mlx-vlm {theirs:6.2f} ms  "
          f"gmlx {ours:5.2f} ms ({theirs / ours:4.1f}x)  the chat intent's whole sampler {whole:5.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,gemma")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    for name in args.models.split(","):
        bench(name, args.reps)


if __name__ == "__main__":
    main()
