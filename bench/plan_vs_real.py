"""Fan-out waves against a real server, each beside gmlx plan's simulation of the same wave on the server's own
measured paces: cold, warm (a shared prefix) and mixed (half the prompt shared) waves at several widths.

    .venv/bin/python bench/plan_vs_real.py [--widths 4,8] [--depth 300] [--output 32] [--decode-batch 4]
                                           [--save-paces FILE]

Starts `gmlx serve` (the default SmolLM2) and warms it up the way that used to flatter the planner: one prompt twice
(the second a prompt-cache hit), then one sharing all but its last words (a short cold tail: with the hit's one
token, two sizes of the short chunks that have their own pace), then a wave as wide as the decode width so every
width's step is measured. Before each wave the prompt cache is reset and the simulator gets the paces /v1/metrics
publishes then (rates.by_model: prefill c + a + b x depth per cold token, and a short chunk's own c and a; restore;
decode step by width) and the wave's shape: its prompt length (/v1/estimate) and how many leading tokens its prompts
share (the most any of its requests reported as cached: a property of the prompts; the simulator decides itself
which requests find them cached). Measured per request: TTFT as the client saw it, queue wait = TTFT less the
server's own prompt time (timings.prompt_ms: prefill start to first token), and the wave's drain (first send to last
end). Prints predicted, measured and measured/predicted for queue wait p50, TTFT p50 and max, and drain, the load
average as each wave ended (the paces and the wave share the machine with whatever else runs), and how many ratios
are within issue 35's 0.8-1.25x. Beside each ratio, a diagnostic that is not the forecast: the same wave simulated
on the paces /v1/metrics published after it (measured during it), so a miss it closes was the machine's load moving
between the paces and the wave, and a miss it keeps is the model's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from gmlx_plan.pace import Paces, paces_from_json
from gmlx_plan.queueing import default_queue_cap
from gmlx_plan.report import cache_mix, paces_text
from gmlx_plan.simulate import ServerSide, SimResult, Workload, simulate
from tests.e2e.server import gmlx_serve

MODEL = "smollm2"
MIXES = ("cold", "warm", "mixed")


WORDS = ("harbour", "lighthouse", "copper", "river", "stone", "garden", "window", "market", "winter", "silver",
         "forest", "bridge", "candle", "paper")


def _words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))  # one SmolLM2 token each


def _text(mix: str, depth: int, i: int, wave: int) -> str:
    """About `depth` tokens of words: distinct from the first one (cold), sharing all but the last eight
    (warm) or the first half (mixed)."""
    shared = {"cold": 0, "warm": depth - 8, "mixed": depth // 2}[mix]
    mine = f"Note {i}: " + _words(depth - shared, 1000 * wave + i)
    return f"{_words(shared, wave)} {mine}" if shared else mine


def _body(text: str, output: int) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": output,
            "temperature": 0, "logit_bias": {"2": -100}, "stream": True, "timings_per_token": True,
            "stream_options": {"include_usage": True}}


@dataclass
class Seen:
    ttft: float = 0.0
    prompt_s: float = 0.0
    done: float = 0.0
    cached: int = 0


def _stream(client: httpx.Client, base: str, body: dict[str, Any], out: Seen, t0: float) -> None:
    with client.stream("POST", base + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(line[:300])
            delta = (chunk.get("choices") or [{}])[0].get("delta", {}) if chunk.get("choices") else {}
            if not out.ttft and delta.get("content"):
                out.ttft = time.perf_counter() - t0
            if "prompt_ms" in (chunk.get("timings") or {}):
                out.prompt_s = chunk["timings"]["prompt_ms"] / 1000
            if chunk.get("usage"):
                out.cached = int((chunk["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    out.done = time.perf_counter() - t0


def wave(base: str, texts: list[str], output: int) -> tuple[list[Seen], float]:
    """Every request sent at once. Each stream's client is made before the clock starts: making one (its SSL
    context) takes 50-130 ms of this process's CPU, which would count as the server's and take the server's cores."""
    seen = [Seen() for _ in texts]
    with ExitStack() as stack:
        clients = [stack.enter_context(httpx.Client(timeout=1800)) for _ in texts]
        bodies = [_body(t, output) for t in texts]
        t0 = time.perf_counter()
        threads = [threading.Thread(target=_stream, args=(c, base, b, s, t0))
                   for c, b, s in zip(clients, bodies, seen, strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return seen, max(s.done for s in seen)


def paces_now(v1: str) -> Paces:
    rates = httpx.get(v1 + "/metrics", timeout=10).json()["server"]["rates"]
    paces = paces_from_json(rates["by_model"][MODEL], "server")
    if paces is None:
        raise RuntimeError(f"the server has measured no paces yet: {rates}")
    return paces


@dataclass
class Row:
    mix: str
    width: int
    figures: list[tuple[str, float, float, float]]  # (name, predicted, measured, predicted on the paces after)
    assumed: dict[str, Any]


def _figures(sim: SimResult) -> list[float]:
    """Queue wait p50, TTFT p50, TTFT max and drain of a simulated wave."""
    ttft = [o.ttft or 0.0 for o in sim.outcomes]
    waits = [o.queue_wait or 0.0 for o in sim.outcomes]
    return [statistics.median(waits), statistics.median(ttft), max(ttft), sim.drain_s]


def one_wave(v1: str, base: str, mix: str, width: int, args: argparse.Namespace, n: int) -> Row:
    httpx.post(base + "/v1/cache/reset", json={}, timeout=30).raise_for_status()
    texts = [_text(mix, args.depth, i, n) for i in range(width)]
    prompt = int(httpx.post(v1 + "/estimate", json=_body(texts[0], args.output), timeout=60).json()["prompt_tokens"])
    paces = paces_now(v1)
    seen, drain = wave(base, texts, args.output)
    shared = max(s.cached for s in seen)
    work = Workload(1, width, prompt, args.output, shared_prefix=shared)
    server = ServerSide(args.decode_batch, default_queue_cap(args.decode_batch))
    sim = simulate(work, server, paces)
    # The same wave on the paces it left behind: a miss that this closes was the load moving, not the model.
    after = _figures(simulate(work, server, paces_now(v1)))
    measured = [statistics.median([max(0.0, s.ttft - s.prompt_s) for s in seen]),
                statistics.median([s.ttft for s in seen]), max(s.ttft for s in seen), drain]
    figures = list(zip(("queue wait p50", "TTFT p50", "TTFT max", "drain"), _figures(sim), measured, after,
                       strict=True))
    assumed = {"prompt_tokens": prompt, "shared_prefix": shared, **cache_mix(sim), "load": os.getloadavg()[0],
               "measured_warm": sum(s.cached >= 64 for s in seen), "paces": paces.as_json()}
    return Row(mix, width, figures, assumed)


def warm_up(v1: str, base: str, args: argparse.Namespace) -> None:
    """A prompt twice (the second restores it: a hit must not read as prefill), one with a short tail after the
    same prefix, then a wave at the decode width."""
    same = _text("warm", args.depth, 0, 99)
    for text in (same, same, _text("warm", args.depth, 1, 99)):
        wave(base, [text], args.output)
    wave(base, [_text("cold", args.depth, i, 98) for i in range(args.decode_batch)], args.output)


def _ratio(pred: float, meas: float) -> str:
    if pred < 0.05 and meas < 0.05:
        return "   (both ~0)"
    return f"{meas / pred:11.2f}x" if pred > 0 else "          -"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--widths", default="4,8")
    ap.add_argument("--depth", type=int, default=300)
    ap.add_argument("--output", type=int, default=32)
    ap.add_argument("--decode-batch", type=int, default=4)
    ap.add_argument("--save-paces", help="write the server's last paces as {model: paces} for gmlx plan --paces")
    args = ap.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    rows: list[Row] = []
    env = {"GMLX_DECODE_BATCH": str(args.decode_batch)}
    with tempfile.TemporaryDirectory() as d, gmlx_serve([], Path(d), env=env) as s:
        warm_up(s.v1, s.base_url, args)
        n = 0
        for mix in MIXES:
            for width in widths:
                rows.append(one_wave(s.v1, s.base_url, mix, width, args, n))
                n += 1
        if args.save_paces:
            Path(args.save_paces).write_text(json.dumps({MODEL: paces_now(s.v1).as_json()}, indent=2))
    print(f"depth {args.depth} words, output {args.output}, decode width {args.decode_batch}")
    print(f"{'wave':12s} {'':15s} {'predicted':>10s} {'measured':>10s} {'meas/pred':>12s} {'on paces after':>15s}")
    for r in rows:
        a = r.assumed
        print(f"{r.mix} x{r.width}: {a['prompt_tokens']}-token prompts, shared prefix {a['shared_prefix']}; "
              f"assumed {a['cold']} cold + {a['warm']} warm (measured {a['measured_warm']} warm); "
              f"load average {a['load']:.2f}")
        print("    " + paces_text(a["paces"]))
        for name, pred, meas, later in r.figures:
            print(f"{'':12s} {name:15s} {pred:9.2f}s {meas:9.2f}s {_ratio(pred, meas)} {_ratio(later, meas):>15s}")
    for label, after in (("ratios", False), ("on the paces after each wave", True)):
        pairs = [(later if after else pred, meas) for r in rows for _, pred, meas, later in r.figures]
        ratios = [meas / pred for pred, meas in pairs if pred >= 0.05]
        held = sum(0.8 <= x <= 1.25 for x in ratios)
        print(f"{label}: min {min(ratios):.2f}x, max {max(ratios):.2f}x; {held} of {len(ratios)} within 0.8-1.25x")


if __name__ == "__main__":
    main()
