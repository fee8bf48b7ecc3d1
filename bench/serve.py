"""Server overhead: decode tok/s through HTTP streaming beside the engine alone, and /health latency under load.

    .venv/bin/python bench/serve.py [--gen 128] [--runs 3]

1. The engine alone (in this process) decodes the chat prompt greedily: decode tok/s (median of runs).
2. A real `gmlx serve` streams the same request over HTTP; decode tok/s is measured at the client from
   the first to the last content chunk. The ratio is the HTTP path's cost.
3. While a stream decodes, /health is polled every 20 ms: p50/p99 latency (it must never wait on the engine).
4. Aggregate decode tok/s with 1, 2 and 4 concurrent streams (continuous batching) and the scaling ratio.
5. /v1/metrics (JSON) and the Prometheus scrape p50/p99 while 4 streams decode.
6. When `llama-server` is on PATH: the same aggregate decode at widths 1, 2 and 4 against llama-server on the
   same file with 4 slots (`-np 4`), and gmlx's ratio to it. Both servers stay up and the two are measured
   alternately, width by width, --runs times (best of each), so the machine's drift hits both alike.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

import bench.blas_first  # noqa: F401  (OpenBLAS before mlx is first imported)
from gmlx_server.engine.loader import load_gguf_model
from gmlx_server.engine.mlx_engine import MLXEngine
from gmlx_server.engine.types import GenerationRequest, SamplingParams, TokenEvent
from tests.conftest import smollm2_path
from tests.e2e.server import gmlx_serve

MESSAGES = [{"role": "user", "content": "Write a long story about a lighthouse keeper and the sea."}]


def engine_decode(gen: int, runs: int) -> tuple[float, list[int]]:
    engine = MLXEngine(lambda: load_gguf_model(smollm2_path(), "smollm2"))
    try:
        text = engine.template.render(MESSAGES, add_generation_prompt=True)
        ids = engine.tokenizer.encode(text, add_special_tokens=False)
        bias = {t: -1e9 for t in engine.tokenizer.eos_ids}  # decode exactly `gen` tokens
        rates = []
        for i in range(runs + 1):
            final: list[TokenEvent] = []
            req = GenerationRequest(f"e{i}", ids, gen, SamplingParams(temperature=0.0, logit_bias=bias))
            engine.generate_sync(req, lambda ev, out=final: out.append(ev) if ev.finish_reason else None)  # type: ignore[misc]
            if i and final[0].timings:  # the first run warms up
                rates.append(final[0].timings.decode_tok_s)
        return statistics.median(rates), sorted(engine.tokenizer.eos_ids)
    finally:
        engine.close()


def _has_text(line: str) -> bool:
    """An SSE chunk that carries generated text (not the role-only first chunk)."""
    if not line.startswith("data: {"):
        return False
    choices = json.loads(line[6:]).get("choices") or [{}]
    return bool(choices[0].get("delta", {}).get("content"))


def http_decode(base: str, gen: int, eos_ids: list[int]) -> float:
    body = {"model": "smollm2", "messages": MESSAGES, "max_tokens": gen, "temperature": 0, "stream": True,
            "logit_bias": {str(t): -100 for t in eos_ids}, "timings_per_token": True}
    stamps: list[float] = []
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if _has_text(line):
                stamps.append(time.perf_counter())
    n = len(stamps)
    return (n - 1) / (stamps[-1] - stamps[0]) if n > 1 else 0.0


def aggregate_decode(base: str, gen: int, eos_ids: list[int], width: int) -> float:
    """`width` concurrent streams: total content chunks over the span from the first to the last chunk."""
    stamps: list[list[float]] = [[] for _ in range(width)]

    def one(i: int) -> None:
        body = {"model": "smollm2", "messages": MESSAGES, "max_tokens": gen, "temperature": 0, "stream": True,
                "logit_bias": {str(t): -100 for t in eos_ids}}
        with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=900) as r:
            for line in r.iter_lines():
                if _has_text(line):
                    stamps[i].append(time.perf_counter())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(width)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Decode rate once every stream has its first token (prefills are serialized by design).
    start = max(st[0] for st in stamps)
    tokens = sum(sum(1 for x in st if x > start) for st in stamps)
    return tokens / (max(st[-1] for st in stamps) - start)


def health_latency(base: str, stop: threading.Event, out: list[float], path: str = "/health") -> None:
    with httpx.Client(timeout=10) as c:
        while not stop.is_set():
            t = time.perf_counter()
            c.get(base + path).raise_for_status()
            out.append(time.perf_counter() - t)
            time.sleep(0.02)


def scrape_latency(base: str, gen: int, eos_ids: list[int]) -> dict[str, list[float]]:
    """/v1/metrics JSON and Prometheus scrape latency while 4 streams decode."""
    lat: dict[str, list[float]] = {"/v1/metrics": [], "/v1/metrics?format=prometheus": []}
    stop = threading.Event()
    pollers = [threading.Thread(target=health_latency, args=(base, stop, out, path)) for path, out in lat.items()]
    for p in pollers:
        p.start()
    aggregate_decode(base, gen, eos_ids, 4)
    stop.set()
    for p in pollers:
        p.join()
    return lat


@contextlib.contextmanager
def llama_server(exe: str, slots: int = 4) -> Iterator[str]:
    """llama.cpp's server on the same GGUF with `slots` parallel slots; yields its base URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [exe, "-m", smollm2_path(), "--port", str(port), "-np", str(slots), "-c", str(2048 * slots)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {proc.returncode}")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        proc.wait(30)


def interleaved(ours: str, theirs: str, gen: int, eos: list[int], runs: int) -> dict[int, tuple[float, float]]:
    """Aggregate decode at widths 1, 2 and 4 on both servers, alternating: the best of `runs` for each."""
    best: dict[int, tuple[float, float]] = {}
    for _ in range(runs):
        for w in (1, 2, 4):
            a, b = aggregate_decode(ours, gen, eos, w), aggregate_decode(theirs, gen, eos, w)
            prev = best.get(w, (0.0, 0.0))
            best[w] = (max(prev[0], a), max(prev[1], b))
    return best


def compare_llama_server(ours: str, gen: int, eos: list[int], runs: int) -> None:
    exe = shutil.which("llama-server")
    if exe is None:
        print("llama-server not on PATH (build it to compare)")
        return
    try:
        with llama_server(exe) as base:
            http_decode(base, 8, eos)  # warm up
            pairs = interleaved(ours, base, gen, eos, runs)
    except (RuntimeError, httpx.HTTPError) as e:
        print(f"llama-server failed: {e}")
        return
    for w, (mine, rate) in pairs.items():
        print(f"width {w}, alternating, best of {runs}: gmlx {mine:6.1f} tok/s, llama-server -np 4 {rate:6.1f} tok/s"
              f"  -> gmlx/llama-server {mine / rate:.2f}x")


def _pct(values: list[float]) -> str:
    q = statistics.quantiles(values, n=100)
    return f"p50 {q[49] * 1000:.1f} ms  p99 {q[98] * 1000:.1f} ms  ({len(values)} probes)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    eng, eos = engine_decode(args.gen, args.runs)
    print(f"engine alone      decode {eng:6.1f} tok/s  (median of {args.runs}, {args.gen} tokens)")
    with tempfile.TemporaryDirectory() as d, gmlx_serve([], Path(d)) as server:
        http_decode(server.base_url, 8, eos)  # load + warm up
        rates: list[float] = []
        lat: list[float] = []
        for _ in range(args.runs):
            stop = threading.Event()
            poller = threading.Thread(target=health_latency, args=(server.base_url, stop, lat))
            poller.start()
            rates.append(http_decode(server.base_url, args.gen, eos))
            stop.set()
            poller.join()
        widths = {w: aggregate_decode(server.base_url, args.gen, eos, w) for w in (1, 2, 4)}
        scrapes = scrape_latency(server.base_url, args.gen // 2, eos)
        compare_llama_server(server.base_url, args.gen, eos, args.runs)
    http = statistics.median(rates)
    print(f"HTTP streaming    decode {http:6.1f} tok/s  -> HTTP/engine {http / eng:.3f} "
          f"(HTTP path costs {100 * (1 - http / eng):+.1f}%)")
    print(f"/health during decode: {_pct(lat)}")
    for w, rate in widths.items():
        print(f"width {w}: aggregate decode {rate:6.1f} tok/s  ({rate / widths[1]:.2f}x width 1)")
    for path, values in scrapes.items():
        print(f"{path} while 4 streams decode: {_pct(values)}")


if __name__ == "__main__":
    main()
