"""The kernels' attention (GKSDPA) over a float32 KV cache against a float16 one, per call.

    .venv/bin/python bench/kv_dtype.py [--rounds 30] [--queries 1,4,512] [--keys 512,3000,8000]

Shapes are the models' own: SmolLM2 135M (9 query heads over 3 KV heads of 64) and Gemma 3 270M's global
layers (4 over 1 of 256). k/v are the first S rows of a cache buffer grown in 256-token steps, as mlx-vlm's
caches hand them back; the mask is what mlx-vlm passes (None for one query, "causal" otherwise). The two
dtypes run interleaved, so they share the machine's load; the line gives median ms, fp32 / fp16 (above 1:
float16 is faster), the bytes a call reads from the cache, and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.blas_first  # noqa: F401  (OpenBLAS before mlx is first imported)

# isort: split
import mlx.core as mx

from gmlx_server.engine.kernels import probe

SHAPES = {"smollm2": (9, 3, 64), "gemma": (4, 1, 256)}  # query heads, KV heads, head size


def _inputs(heads: int, kv: int, d: int, L: int, S: int) -> tuple[mx.array, dict[str, tuple[mx.array, mx.array]]]:
    room = (S // 256 + 1) * 256
    q = mx.random.normal((1, heads, L, d))
    kbuf, vbuf = mx.random.normal((1, kv, room, d)), mx.random.normal((1, kv, room, d))
    caches = {dt: (kbuf.astype(t)[..., :S, :], vbuf.astype(t)[..., :S, :])
              for dt, t in (("fp32", mx.float32), ("fp16", mx.float16))}
    mx.eval(q, *[a for kv_ in caches.values() for a in kv_])
    return q, caches


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--queries", default="1,4,512")
    ap.add_argument("--keys", default="512,3000,8000")
    a = ap.parse_args()
    ext = probe().ext
    if ext is None:
        sys.exit(f"the kernels are not available: {probe().reason}")
    mx.random.seed(0)
    print(f"GKSDPA on {ext.isa()}, {ext.threads()} threads; {a.rounds} interleaved rounds a shape")
    for name, (heads, kv, d) in SHAPES.items():
        for L in map(int, a.queries.split(",")):
            for S in map(int, a.keys.split(",")):
                if L > S:
                    continue
                q, caches = _inputs(heads, kv, d, L, S)
                times: dict[str, list[float]] = {dt: [] for dt in caches}
                for _ in range(a.rounds):
                    for dt, (k, v) in caches.items():
                        t = time.perf_counter()
                        mx.eval(ext.sdpa(q, k, v, 0.125, None, causal=L > 1))
                        times[dt].append(time.perf_counter() - t)
                med = {dt: statistics.median(ts) for dt, ts in times.items()}
                mb = 2 * kv * S * d * 4 / 1e6
                ratio = med["fp32"] / med["fp16"]
                print(f"{name:8s} L {L:4d} S {S:5d}  fp32 {med['fp32'] * 1e3:7.3f} ms ({mb:5.1f} MB)  "
                      f"fp16 {med['fp16'] * 1e3:7.3f} ms ({mb / 2:5.1f} MB)  fp32/fp16 {ratio:5.2f}x"
                      f"  load average {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
