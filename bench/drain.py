"""The server's drain estimate (queue.eta_s, what Retry-After carries) against the measured drain.

    .venv/bin/python bench/drain.py [--requests 12] [--output 32] [--decode-batch 4] [--rounds 2]

Starts `gmlx serve` (the default SmolLM2), warms it up, then per round sends `requests` streams at once
(short prompts, `output` tokens each, EOS banned), reads /v1/metrics' queue.eta_s as soon as every request
is in, and times the real drain. Prints both and their ratio per round.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from tests.e2e.server import gmlx_serve


def _body(i: int, output: int) -> dict[str, object]:
    return {"model": "smollm2", "messages": [{"role": "user", "content": f"Request {i}: tell me about lighthouses."}],
            "max_tokens": output, "temperature": 0, "logit_bias": {"2": -100}}


def wave(base: str, n: int, output: int) -> tuple[float, float]:
    """(eta_s the server predicted once all n were in, measured seconds until the last one finished)."""
    done: list[float] = []

    def one(i: int) -> None:
        httpx.post(base + "/v1/chat/completions", json=_body(i, output), timeout=1800).raise_for_status()
        done.append(time.perf_counter())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    eta = 0.0
    while True:  # wait until the server counts every request (in flight + waiting), then read its estimate
        q = httpx.get(base + "/v1/metrics", timeout=10).json()["server"]
        c = q["concurrency"]
        if c["in_flight"] + c["waiting"] >= n:
            eta, t_eta = float(q["queue"]["eta_s"]), time.perf_counter()
            break
        time.sleep(0.02)
    for t in threads:
        t.join()
    return eta, max(done) - t_eta


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--output", type=int, default=32)
    ap.add_argument("--decode-batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    env = {"GMLX_DECODE_BATCH": str(args.decode_batch), "GMLX_QUEUE_DEPTH_CAP": str(args.requests)}
    with tempfile.TemporaryDirectory() as d, gmlx_serve([], Path(d), env=env) as s:
        wave(s.base_url, args.decode_batch, args.output)  # warm-up: loads the model, measures rates at full width
        print(f"{'round':>5s} {'predicted':>10s} {'measured':>9s} {'measured/predicted':>19s}")
        for r in range(args.rounds):
            eta, real = wave(s.base_url, args.requests, args.output)
            print(f"{r:5d} {eta:9.2f}s {real:8.2f}s {real / eta if eta else float('nan'):18.2f}x")


if __name__ == "__main__":
    main()
