"""GB/s of gmlx's GGUF kernels per format and shape, beside a memory-copy ceiling and dense fp32 sgemm.

    .venv/bin/python bench/kernel_speed.py [--threads N] [--rows 1,4,64,512] [--formats Q4_1,Q4_K,...]

Shapes are the test models' projections (SmolLM2 576/1536, Gemma 3 640/2048 and their vocab heads; the
K-quants take 1024/2048 since their 256-element blocks do not divide 576 or 640). Weights are random
valid blocks. "GB/s" counts the weight bytes read once per call; "vs copy" divides that by the bandwidth
numpy reaches copying a buffer larger than the last-level cache (bytes read + bytes written), single
thread. "vs sgemm" is the speed-up over MLX's fp32 matmul (OpenBLAS when preloaded) on the dequantized
weights. Medians of --reps timed calls, wall clock; a busy machine lowers every figure alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.blas_first  # noqa: F401  (OpenBLAS before mlx is first imported)

# isort: split
import gguf
import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType

from gmlx_server.engine.kernels import NATIVE_TYPES, probe
from tests.unit.test_kernels import random_blocks

SHAPES_32 = [(1536, 576), (576, 1536), (2048, 640), (49152, 576)]  # (out, in) for 32-element blocks
SHAPES_256 = [(2048, 1024), (1024, 2048), (32768, 1024)]


def copy_ceiling(mb: int = 1024) -> float:
    """GB/s numpy moves copying `mb` MB (read + write), best of 5."""
    a = np.ones(mb << 18, dtype=np.float32)
    b = np.empty_like(a)
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(b, a)
        best = max(best, 2 * a.nbytes / (time.perf_counter() - t) / 1e9)
    return best


def timed(fn: Callable[[], mx.array], reps: int) -> float:
    mx.eval(fn())
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        mx.eval(fn())
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def bench_one(ext: object, name: str, n: int, k: int, rows: int, reps: int, ceiling: float) -> str:
    rng = np.random.default_rng(0)
    blocks = random_blocks(rng, name, n, k)
    w, x = mx.array(blocks), mx.array(rng.standard_normal((rows, k)).astype(np.float32))
    qtype = NATIVE_TYPES[name]
    dt = timed(lambda: ext.matmul(x, w, qtype, k), reps)  # type: ignore[attr-defined]
    dense = mx.array(gguf.quants.dequantize(blocks, GGMLQuantizationType[name]).T.copy())
    dt_dense = timed(lambda: x @ dense, reps)
    gbs = blocks.nbytes / dt / 1e9
    return (f"{name:5s} {n:6d}x{k:<5d} rows {rows:4d}  {dt * 1e6:9.1f} us  {gbs:6.1f} GB/s  "
            f"{gbs / ceiling:5.2f}x copy  {2 * rows * n * k / dt / 1e9:7.1f} GFLOP/s  "
            f"{dt_dense / dt:5.2f}x sgemm")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0, help="kernel threads (0: the usable cores)")
    ap.add_argument("--rows", default="1,4,64,512")
    ap.add_argument("--formats", default=",".join(NATIVE_TYPES))
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    status = probe()
    if status.ext is None:
        sys.exit(f"kernels unavailable: {status.reason}")
    ext = status.ext
    ext.set_threads(args.threads)
    ceiling = copy_ceiling()
    print(f"kernels {ext.isa()} ({', '.join(ext.isas())} usable), {ext.threads()} threads; "
          f"memory copy {ceiling:.1f} GB/s (numpy, 1 thread, read+write)")
    for name in args.formats.split(","):
        shapes = SHAPES_256 if name.endswith("_K") else SHAPES_32
        for n, k in shapes:
            for rows in (int(r) for r in args.rows.split(",")):
                reps = args.reps if rows * n < 2_000_000 else max(3, args.reps // 3)
                print(bench_one(ext, name, n, k, rows, reps, ceiling), flush=True)


if __name__ == "__main__":
    main()
