"""GB/s of gmlx's GGUF kernels per format and shape, beside memory-bandwidth ceilings and dense fp32 sgemm.

    .venv/bin/python bench/kernel_speed.py [--threads N] [--rows 1,4,64,512] [--formats Q4_1,Q4_K,...]
                                           [--modes f32,auto] [--warm]

--modes times each activation mode of the few-row kernels on the same weights, in turn, and prints the
last one's speed-up over the first: f32 (fp32 activations, the kernels before integer dot products),
int16 (int16 activations, integer dot products), auto (the default: int16 up to a per-format row count).
--warm keeps one copy of the weights (L2/L3-resident: what the kernel computes, not what memory feeds).

Shapes are the test models' projections (SmolLM2 576/1536, Gemma 3 640/2048 and their vocab heads; the
K-quants take 1024/2048 since their 256-element blocks do not divide 576 or 640). Weights are random
valid blocks in enough copies (>= --cold-mb) that every call reads them from memory, as a decode step
does; each timed eval runs 8 matmuls on different copies, so MLX's per-eval cost is shared as in a model's
graph. "GB/s" counts the weight bytes read; "vs read" divides it by the read ceiling: numpy OR-reducing
a 1 GB buffer on as many threads as the kernels use (the most any reader gets here). The copy ceiling
(numpy, one thread, bytes read + written) is printed beside it. From 48 rows on the figure that matters
is GFLOP/s and "vs sgemm", the speed-up over MLX's fp32 matmul (OpenBLAS when preloaded) on the
dequantized weights. Best of --reps evals, wall clock: a busy machine lowers every figure alike.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.blas_first  # noqa: F401  (OpenBLAS before mlx is first imported)

# isort: split
import gguf
import mlx.core as mx
import numpy as np

from gmlx_server.engine.kernels import probe
from tests.unit.test_kernels import KERNEL_TYPES, as_stored, ggml_type, random_blocks

SHAPES_32 = [(1536, 576), (576, 1536), (2048, 640), (49152, 576)]  # (out, in) for 32-element blocks
SHAPES_256 = [(2048, 1024), (1024, 2048), (32768, 1024)]
PER_EVAL = 8  # matmuls per timed eval
SGEMM_FROM = 48  # rows from which GFLOP/s and the sgemm ratio are the figures (dispatch.cpp's threshold)


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


def read_ceiling(threads: int, mb: int = 1024) -> float:
    """GB/s `threads` numpy threads read OR-reducing `mb` MB (the GIL is released in the loop), best of 5."""
    a = np.ones(mb << 17, dtype=np.int64)
    parts = np.array_split(a, threads)
    best = 0.0
    for _ in range(5):
        workers = [threading.Thread(target=np.bitwise_or.reduce, args=(p,)) for p in parts]
        t = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = max(best, a.nbytes / (time.perf_counter() - t) / 1e9)
    return best


def best_time(fn: Callable[[int], list[mx.array]], reps: int) -> float:
    mx.eval(fn(0))
    best = float("inf")
    for i in range(1, reps + 1):
        t = time.perf_counter()
        mx.eval(fn(i))
        best = min(best, time.perf_counter() - t)
    return best


def bench_one(ext: ModuleType, name: str, n: int, k: int, rows: int, reps: int, cold_mb: int,
              ceilings: tuple[float, float], modes: list[str]) -> str:
    rng = np.random.default_rng(0)
    blocks = random_blocks(rng, ggml_type(name).name, n, k)
    copies = max(PER_EVAL, -(-(cold_mb << 20) // blocks.nbytes)) if cold_mb else 1
    big, qtype = as_stored(ext, name, np.tile(blocks, (copies, 1)))  # the copies back to back, one matrix a slice
    ws = [big[i * n:(i + 1) * n] for i in range(copies)]
    x = mx.array(rng.standard_normal((rows, k)).astype(np.float32))

    def calls(i: int) -> list[mx.array]:
        return [ext.matmul(x, ws[(i * PER_EVAL + j) % copies], qtype, k)
                for j in range(PER_EVAL)]

    times = {}
    for mode in modes:
        ext.set_activations(mode)
        times[mode] = best_time(calls, reps) / PER_EVAL
    dt = times[modes[-1]]
    gbs, flops = blocks.nbytes / dt / 1e9, 2 * rows * n * k / dt / 1e9
    line = f"{name:6s} {n:6d}x{k:<5d} rows {rows:4d}  {dt * 1e6:9.1f} us  {gbs:6.1f} GB/s  "
    if rows < SGEMM_FROM:
        if len(modes) > 1:
            each = "  ".join(f"{m} {blocks.nbytes / times[m] / 1e9:5.1f}" for m in modes)
            line += f"[{each} GB/s: {times[modes[0]] / dt:4.2f}x]  "
        return line + f"{gbs / ceilings[0]:5.2f}x read  {gbs / ceilings[1]:5.2f}x copy  {flops:6.1f} GFLOP/s"
    dense = mx.array(gguf.quants.dequantize(blocks, ggml_type(name)).T.copy())
    dt_dense = best_time(lambda i: [x @ dense], max(3, reps // 3))
    return line + f"{flops:6.1f} GFLOP/s  {dt_dense / dt:5.2f}x sgemm"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0, help="kernel threads (0: the usable cores)")
    ap.add_argument("--rows", default="1,4,64,512")
    ap.add_argument("--formats", default=",".join(KERNEL_TYPES), help="Q4_K_R: Q4_K repacked as the loader does")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--cold-mb", type=int, default=256, help="weight copies per shape, so reads miss the caches")
    ap.add_argument("--warm", action="store_true", help="one copy of the weights (cache-resident)")
    ap.add_argument("--modes", default="auto", help="activation modes timed in turn (f32,int16,int8,auto)")
    ap.add_argument("--shapes", default="", help="out x in pairs, e.g. 17920x1536,1536x8960 (default: per format)")
    ap.add_argument("--isa", default="", help="force one of ext.isas() (default: the best the CPU has)")
    args = ap.parse_args()
    modes = args.modes.split(",")
    status = probe()
    if status.ext is None:
        sys.exit(f"kernels unavailable: {status.reason}")
    ext = status.ext
    ext.set_threads(args.threads)
    if args.isa:
        ext.set_isa(args.isa)
    ceilings = (read_ceiling(ext.threads()), copy_ceiling())
    print(f"kernels {ext.isa()} ({', '.join(ext.isas())} usable), {ext.threads()} threads, activations "
          f"{'/'.join(modes)}; memory read {ceilings[0]:.1f} GB/s (numpy, {ext.threads()} threads), "
          f"copy {ceilings[1]:.1f} GB/s (numpy, 1 thread, read+write)")
    for name in args.formats.split(","):
        shapes = SHAPES_256 if "_K" in name else SHAPES_32
        if args.shapes:
            shapes = [(int(a), int(b)) for a, b in (s.split("x") for s in args.shapes.split(","))]
        for n, k in shapes:
            for rows in (int(r) for r in args.rows.split(",")):
                reps = args.reps if rows * n < 2_000_000 else max(3, args.reps // 3)
                cold = 0 if args.warm else args.cold_mb
                print(bench_one(ext, name, n, k, rows, reps, cold, ceilings, modes), flush=True)


if __name__ == "__main__":
    main()
