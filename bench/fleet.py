"""1, 2 and 3 `gmlx serve` hosts behind HAProxy (deploy/haproxy) under the same offered load, side by side.

    .venv/bin/python bench/fleet.py [--rate 1.0] [--seconds 30] [--output 32] [--decode-batch 4]

Starts three hosts (the embedded SmolLM2) on loopback, then for each fleet size puts HAProxy in front of
the first N of them and sends the same open-loop load: one short streamed chat every 1/rate seconds for
`seconds` (EOS banned, `output` tokens each), whatever is still running. Prints per size: requests,
completed, refused (503), aggregate generated tokens/s (all tokens over the wall time from the first send
to the last end) and TTFT p50/p99 as clients saw it through the proxy, and beside them what `gmlx plan simulate
--hosts N` predicts for the same load (gmlx_plan.fleet.simulate_fleet: the requests spread over the same
seconds, split over N hosts, on the paces host N's /v1/metrics published after that run: host N served only
that run and its one warm-up request, so its paces were measured under that run's sharing of the cores,
where host 1's would still hold the smaller fleets' spans and steps). Then measured/predicted per size for
queue wait p50 (TTFT less the server's own prompt time, timings.prompt_ms), TTFT p50 and max, drain (first
send to last end) and tok/s, with the load average as each run ended.
All hosts share this machine's cores, so here more hosts add queue room and isolation, not compute: see
docs/operations.md "Running several hosts".
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from gmlx_plan.fleet import simulate_fleet
from gmlx_plan.pace import paces_from_json
from gmlx_plan.simulate import Outcome, ServerSide, SimResult, Workload
from tests.fleet.haproxy import haproxy, hosts_of
from tests.fleet.live import EOS_BAN, Host, start_all


@dataclass
class Result:
    status: int = 0
    ttft_s: float | None = None
    prompt_s: float = 0.0  # the server's own prefill time (timings.prompt_ms): TTFT less it is the queue wait
    tokens: int = 0
    end: float = 0.0


def _body(i: int, output: int) -> dict[str, object]:
    return {"model": "smollm2", "messages": [{"role": "user", "content": f"Request {i}: tell me about harbours."}],
            "max_tokens": output, "temperature": 0, "logit_bias": EOS_BAN, "stream": True,
            "timings_per_token": True, "stream_options": {"include_usage": True}}


def one(url: str, i: int, output: int) -> Result:
    out, t0 = Result(), time.perf_counter()
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=_body(i, output), timeout=900) as r:
            out.status = r.status_code
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line.removeprefix("data: "))
                if out.ttft_s is None and any((c.get("delta") or {}).get("content") for c in chunk["choices"]):
                    out.ttft_s = time.perf_counter() - t0
                if "prompt_ms" in (chunk.get("timings") or {}):
                    out.prompt_s = chunk["timings"]["prompt_ms"] / 1000
                if chunk.get("usage"):  # the last chunk (stream_options.include_usage)
                    out.tokens = int(chunk["usage"]["completion_tokens"])
    except httpx.HTTPError:
        out.status = -1
    out.end = time.perf_counter()
    return out


def rank(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))]


def offered(url: str, rate: float, seconds: float, output: int) -> tuple[list[Result], float]:
    """Open loop: request i leaves at i / rate s, whatever is still running. (results, wall seconds)."""
    n = max(1, round(rate * seconds))
    start = time.perf_counter()
    futures: list[Future[Result]] = []
    with ThreadPoolExecutor(n) as pool:
        for i in range(n):
            time.sleep(max(0.0, start + i / rate - time.perf_counter()))
            futures.append(pool.submit(one, url, i, output))
        results = [f.result() for f in futures]
    return results, max(r.end for r in results) - start


def warm(hs: list[Host], output: int) -> None:
    for h in hs:  # each host loads its model and meets the prompt once
        one(h.url, 0, output)


def predict(host: Host, n: int, hosts: int, args: argparse.Namespace) -> SimResult:
    """The same open-loop load in the simulator, on the paces `host` (the fleet's newest) measured meanwhile."""
    v1 = host.url + "/v1"
    rates = httpx.get(v1 + "/metrics", timeout=10).json()["server"]["rates"]
    paces = paces_from_json(rates["by_model"]["smollm2"], host.url)
    if paces is None:
        raise RuntimeError(f"{host.url} has measured no paces: {rates}")
    streaming = ("stream", "stream_options", "timings_per_token")
    body = {k: v for k, v in _body(0, args.output).items() if k not in streaming}
    prompt = int(httpx.post(v1 + "/estimate", json=body, timeout=60).json()["prompt_tokens"])
    work = Workload(1, n, prompt, args.output, spread_s=n / args.rate, seed=1)
    return simulate_fleet(work, ServerSide(args.decode_batch, 2 * args.decode_batch), paces, hosts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=1.0, help="requests per second offered")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--output", type=int, default=32)
    ap.add_argument("--decode-batch", type=int, default=4)
    args = ap.parse_args()
    env = {"GMLX_DECODE_BATCH": str(args.decode_batch), "GMLX_QUEUE_DEPTH_CAP": str(2 * args.decode_batch)}
    with tempfile.TemporaryDirectory() as tmp:
        hs = [Host(f"gmlx{i + 1}", Path(tmp), env=env) for i in range(3)]
        try:
            start_all(hs)
            warm(hs, args.output)
            rows = []
            predicted: list[tuple[float, float | None, float | None]] = []
            ratios: list[list[float | None]] = []  # queue wait p50, TTFT p50, TTFT max, drain, tok/s
            loads: list[float] = []  # the 1-minute load average as each fleet's run ended (a shared machine)
            for n in (1, 2, 3):
                with haproxy(hosts_of([h.url for h in hs[:n]]), Path(tmp)) as proxy:
                    results, wall = offered(proxy.url, args.rate, args.seconds, args.output)
                loads.append(os.getloadavg()[0])
                ok = [r for r in results if r.status == 200 and r.tokens]
                ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
                rows.append((n, len(results), len(ok), sum(r.status == 503 for r in results),
                             sum(r.tokens for r in ok) / wall, rank(ttfts, 0.5), rank(ttfts, 0.99)))
                sim = predict(hs[n - 1], len(results), n, args)
                done = [o for o in sim.outcomes if o.status == "completed"]
                p_ttft = [t for o in done if (t := o.ttft) is not None]
                predicted.append((len(done) * args.output / sim.drain_s, rank(p_ttft, 0.5), rank(p_ttft, 0.99)))
                ratios.append(_ratios(ok, ttfts, wall, done, p_ttft, sim.drain_s, rows[-1][4] / predicted[-1][0]))
        finally:
            for h in hs:
                h.stop()
    print(f"offered: {args.rate:g} req/s for {args.seconds:g} s, {args.output} tokens each; decode width "
          f"{args.decode_batch} per host, queue cap {2 * args.decode_batch}")
    print(f"{'hosts':>5} {'requests':>8} {'done':>5} {'503':>4} {'tok/s':>7} {'TTFT p50':>9} {'TTFT p99':>9}"
          f"   | gmlx plan --hosts: {'tok/s':>7} {'TTFT p50':>9} {'TTFT p99':>9}  measured/predicted tok/s")
    for (n, reqs, completed, refused, tok_s, p50, p99), (p_tok, p_p50, p_p99) in zip(rows, predicted, strict=True):
        print(f"{n:>5} {reqs:>8} {completed:>5} {refused:>4} {tok_s:>7.1f} {_s(p50):>9} {_s(p99):>9}"
              f"   | {'':18s} {p_tok:>7.1f} {_s(p_p50):>9} {_s(p_p99):>9}  {tok_s / p_tok:.2f}x")
    print(f"measured/predicted {'queue wait p50':>15} {'TTFT p50':>9} {'TTFT max':>9} {'drain':>6} {'tok/s':>6}"
          "  load average")
    for n, figures, load in zip((1, 2, 3), ratios, loads, strict=True):
        cells = " ".join(f"{'-' if r is None else f'{r:.2f}x':>{w}}" for r, w in zip(figures, (15, 9, 9, 6, 6),
                                                                                       strict=True))
        print(f"{n:>5} hosts{'':12s} {cells}  {load:.2f}")


def _ratios(ok: list[Result], ttfts: list[float], wall: float, done: list[Outcome], p_ttft: list[float],
            p_drain: float, tok_s: float) -> list[float | None]:
    """Measured over predicted: queue wait p50, TTFT p50, TTFT max, drain, tok/s (None where the plan says 0)."""
    def over(m: float | None, p: float | None) -> float | None:
        return m / p if m is not None and p else None

    waits = [max(0.0, r.ttft_s - r.prompt_s) for r in ok if r.ttft_s is not None]
    p_waits = [o.queue_wait or 0.0 for o in done]
    return [over(rank(waits, 0.5), rank(p_waits, 0.5)), over(rank(ttfts, 0.5), rank(p_ttft, 0.5)),
            over(max(ttfts, default=None), max(p_ttft, default=None)), over(wall, p_drain), tok_s]


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}s"


if __name__ == "__main__":
    main()
