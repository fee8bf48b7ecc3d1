"""One decode step with and without each of gmlx's step-overhead cuts, A/B alternating in one process.

    .venv/bin/python bench/decode_step.py [--models smollm2,gemma,qwen0.5b] [--reps 3] [--steps 10]

Per model, the width-1 decode step's median time (wall, and process CPU with the kernels on one thread so a
busy machine's other jobs do not count) in five configurations of the native layout:
  all on      the CPU norm/RoPE/attention primitives, the fused q/k/v and gate/up projections, each attention
              layer's heads (split, q/k norms, RoPE, KV cast) as one primitive (engine/kernels/heads.py), and
              each residual add fused with the norm after it (engine/kernels/blocks.py)
  no blocks   all on but the fused adds: the layers' own forward, each add and norm an op
  no heads    all on but the heads: mlx-vlm's attention forward around the same primitives
  no fusion   the primitives, each projection its own matmul
  no prims    the fused projections, MLX's own norm, RoPE and attention ops
and the ratios against "all on". Configurations alternate rep by rep, so the machine's noise hits each alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.blas_first  # noqa: F401  (OpenBLAS before mlx is first imported)

# isort: split
import mlx.core as mx

from gmlx_server.engine import loader
from gmlx_server.engine.arch import make_cache
from gmlx_server.engine.kernels import probe
from tests.conftest import gemma_path, qwen_coder_path, smollm2_path

MODELS: dict[str, Callable[[], str]] = {"smollm2": smollm2_path, "gemma": gemma_path,
                                        "qwen0.5b": lambda: qwen_coder_path("0.5b")}


def _load(path: str, fuse: bool, heads: bool = True, blocks: bool = True) -> Any:
    real, real_heads, real_blocks = loader.fuse_projections, loader.use_heads_attention, loader.use_fused_blocks
    if not fuse:
        loader.fuse_projections = lambda model: 0  # type: ignore[assignment]
    if not heads:
        loader.use_heads_attention = lambda model, prims: 0  # type: ignore[assignment]
    if not blocks:
        loader.use_fused_blocks = lambda model, prims: 0  # type: ignore[assignment]
    try:
        return loader.load_gguf_model(path)
    finally:
        loader.fuse_projections, loader.use_heads_attention, loader.use_fused_blocks = real, real_heads, real_blocks


def _step_ms(model: Any, clock: Callable[[], float], steps: int) -> float:
    cache = make_cache(model)
    mx.eval(model(mx.array([[1, 2, 3, 4] * 16]), cache=cache).logits)
    samples = []
    for _ in range(steps):
        t = clock()
        mx.eval(model(mx.array([[5]]), cache=cache).logits)
        samples.append(clock() - t)
    return statistics.median(samples) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2,gemma")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    ext = probe().ext
    if ext is None:
        sys.exit(f"the CPU kernels are not available: {probe().reason}")
    for name in args.models.split(","):
        path = MODELS[name]()
        fused, plain, separate = _load(path, True), _load(path, False), _load(path, True, heads=False)
        unblocked = _load(path, True, blocks=False)
        configs = {"all on": (fused, True), "no blocks": (unblocked, True), "no heads": (separate, True),
                   "no fusion": (plain, True), "no prims": (fused, False)}
        kernels = fused.kernels
        assert kernels is not None and plain.kernels is not None  # the native layout: the primitives swapped in
        for label, clock, threads in (("wall", time.perf_counter, 0), ("cpu 1 thread", time.process_time, 1)):
            ext.set_threads(threads)
            runs: dict[str, list[float]] = {c: [] for c in configs}
            for _ in range(args.reps):
                for c, (lm, prims) in configs.items():
                    kernels.ext = ext if prims else None  # the fused model's own switch: MLX's ops for "no prims"
                    runs[c].append(_step_ms(lm.model, clock, args.steps))
            kernels.ext = ext
            med = {c: statistics.median(v) for c, v in runs.items()}
            base = med["all on"]
            print(f"{name:9s} {label:13s} " + "  ".join(
                f"{c} {m:6.1f} ms ({m / base:.2f}x)" for c, m in med.items()))
        ext.set_threads(0)


if __name__ == "__main__":
    main()
