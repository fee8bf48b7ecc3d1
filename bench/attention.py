"""Attention on MLX's CPU backend: mx.fast.scaled_dot_product_attention against the alternatives.

    .venv/bin/python bench/attention.py [--rounds 5] [--queries 1,160,512] [--keys 512,3400,8000]

Shapes are SmolLM2 135M's: q (1, 9, L, 64) against k/v (1, 3, S, 64), float32, with the mask mlx-vlm
passes (None for one query, "causal" otherwise) and k/v sliced from a longer buffer as KVCache returns
them. Candidates run interleaved, `rounds` times each, so they share the machine's load; the table gives
median ms, the speed-up over sdpa (`x sdpa`: the median of each round's sdpa time / the candidate's;
`cpu x`: the same from median process CPU time, all threads) and the largest |difference| from sdpa.
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

from gmlx_server.engine.attention import cpu_attention
from gmlx_server.engine.blas import current_blas

Attn = Callable[[mx.array, mx.array, mx.array, float, Any], mx.array]


def sdpa(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Any) -> mx.array:
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


def sdpa_contiguous(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Any) -> mx.array:
    """The cache's views copied to contiguous arrays first (the copy is timed)."""
    return sdpa(q, mx.contiguous(k), mx.contiguous(v), scale, mask)


def _causal(L: int, S: int) -> mx.array:
    return mx.arange(S - L, S)[:, None] >= mx.arange(S)[None]


def repeat_kv(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Any) -> mx.array:
    """Textbook GQA: K/V repeated to every query head, explicit matmuls, mx.softmax(precise=True)."""
    r = q.shape[1] // k.shape[1]
    k, v = mx.repeat(k, r, axis=1), mx.repeat(v, r, axis=1)
    s = (q * scale) @ k.swapaxes(-1, -2)
    if mask is not None:
        s = mx.where(_causal(q.shape[2], k.shape[2]), s, mx.finfo(s.dtype).min)
    return mx.softmax(s, axis=-1, precise=True) @ v


def folded_softmax(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Any) -> mx.array:
    """GQA folded into the matmul rows, (1, 3, 3L, 64) @ (1, 3, 64, S), then mx.softmax(precise=True)."""
    B, H, L, D = q.shape
    Hk, S = k.shape[1], k.shape[2]
    s = ((q * scale).reshape(B, Hk, H // Hk * L, D) @ k.swapaxes(-1, -2)).reshape(B, Hk, H // Hk, L, S)
    if mask is not None:
        s = mx.where(_causal(L, S), s, mx.finfo(s.dtype).min)
    p = mx.softmax(s, axis=-1, precise=True).reshape(B, Hk, H // Hk * L, S)
    return (p @ v).reshape(B, H, L, D)


def softmax_only(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Any) -> mx.array:
    """Not attention: mx.softmax alone over a (1, 9, L, S) input, to show where sdpa's time goes."""
    return mx.softmax(mx.broadcast_to(q[..., :1], (*q.shape[:3], k.shape[2])) * 1.0, axis=-1, precise=True)


CANDIDATES: dict[str, Attn] = {
    "sdpa": sdpa, "sdpa_contig": sdpa_contiguous, "repeat_kv": repeat_kv,
    "folded_softmax": folded_softmax, "gmlx_cpu": cpu_attention, "(softmax)": softmax_only,
}


def inputs(L: int, S: int) -> tuple[mx.array, mx.array, mx.array]:
    """q, and k/v as KVCache hands them back: the first S rows of a buffer grown in steps of 256."""
    room = (S // 256 + 1) * 256
    q = mx.random.normal((1, 9, L, 64))
    kbuf, vbuf = mx.random.normal((1, 3, room, 64)), mx.random.normal((1, 3, room, 64))
    mx.eval(q, kbuf, vbuf)
    return q, kbuf[..., :S, :], vbuf[..., :S, :]


def timed(fn: Attn, args: tuple[mx.array, mx.array, mx.array], mask: Any) -> tuple[float, float]:
    """Wall seconds and process CPU seconds (all threads; less sensitive to other load) of one call."""
    c, t = time.process_time(), time.perf_counter()
    mx.eval(fn(*args, 0.125, mask))
    return time.perf_counter() - t, time.process_time() - c


def shape_row(L: int, S: int, rounds: int) -> dict[str, tuple[float, float, float, float]]:
    """Per candidate: median wall s, median per-round sdpa/candidate wall ratio, CPU-time ratio, max |out - sdpa|."""
    args = inputs(L, S)
    mask = "causal" if L > 1 else None
    ref = sdpa(*args, 0.125, mask)
    errs = {n: float(mx.abs(f(*args, 0.125, mask) - ref).max()) if n[0] != "(" else float("nan")
            for n, f in CANDIDATES.items()}  # also warms each path up
    # Short shapes get more rounds (about 6 s of sdpa): the machine is shared, so pair and repeat.
    rounds = max(rounds, min(300, int(6.0 / max(timed(sdpa, args, mask)[0], 1e-4))))
    wall: dict[str, list[float]] = {n: [] for n in CANDIDATES}
    cpu: dict[str, list[float]] = {n: [] for n in CANDIDATES}
    for _ in range(rounds):
        for n, f in CANDIDATES.items():
            w, c = timed(f, args, mask)
            wall[n].append(w)
            cpu[n].append(c)
    med = statistics.median
    return {n: (med(w), med(a / b for a, b in zip(wall["sdpa"], w, strict=True)), med(cpu["sdpa"]) / med(cpu[n]),
                errs[n]) for n, w in wall.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--queries", default="1,160,512")
    ap.add_argument("--keys", default="512,3400,8000")
    a = ap.parse_args()
    mx.random.seed(0)
    print(f"BLAS {current_blas().name}; device {mx.default_device()}; at least {a.rounds} interleaved rounds a shape")
    print(f"{'L':>4} {'S':>5} {'candidate':>15} {'ms':>9} {'x sdpa':>7} {'cpu x':>6} {'max|diff|':>10}")
    for L in map(int, a.queries.split(",")):
        for S in map(int, a.keys.split(",")):
            if L > S:
                continue
            row = shape_row(L, S, a.rounds)
            for n, (t, ratio, cpu, err) in row.items():
                print(f"{L:>4} {S:>5} {n:>15} {t * 1e3:>9.2f} {ratio:>7.2f} {cpu:>6.2f} {err:>10.1e}", flush=True)


if __name__ == "__main__":
    main()
