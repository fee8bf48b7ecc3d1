"""One fan-out wave against a real server, beside gmlx plan's simulation of the same wave.

    .venv/bin/python bench/plan_vs_real.py [--width 6] [--depth 200] [--output 32] [--decode-batch 4]

Starts `gmlx serve` (the default SmolLM2), warms it up so /v1/metrics has measured rates, then sends
`width` requests at once (prompts of about `depth` tokens, `output` tokens each, EOS banned). The
simulator gets the server's own rates and queue settings. Prints predicted vs measured queue wait
(time to the start of prefill), TTFT and drain time, and their ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from gmlx_plan.queueing import Rates, default_queue_cap
from gmlx_plan.simulate import ServerSide, Workload, simulate
from tests.e2e.server import gmlx_serve

WORD = "lighthouse "  # about one token per word for SmolLM2


def _body(depth: int, output: int, i: int) -> dict[str, object]:
    text = f"Request {i}. " + WORD * max(1, depth - 20)
    return {"model": "smollm2", "messages": [{"role": "user", "content": text}], "max_tokens": output,
            "temperature": 0, "stream": True, "logit_bias": {"2": -100}}


def _has_text(line: str) -> bool:
    """An SSE chunk that carries generated text (not the role-only first chunk)."""
    if not line.startswith("data: {"):
        return False
    choices = json.loads(line[6:]).get("choices") or [{}]
    return bool(choices[0].get("delta", {}).get("content"))


def _stream(base: str, body: dict[str, object], out: dict[str, float]) -> None:
    t0 = time.perf_counter()
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=1800) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if line.startswith("data: {") and '"error"' in line:
                raise RuntimeError(line[:300])
            if "first" not in out and _has_text(line):
                out["first"] = time.perf_counter() - t0
    out["done"] = time.perf_counter() - t0


def measure(base: str, width: int, depth: int, output: int) -> list[dict[str, float]]:
    results: list[dict[str, float]] = [{} for _ in range(width)]
    threads = [threading.Thread(target=_stream, args=(base, _body(depth, output, i), results[i]))
               for i in range(width)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=6)
    ap.add_argument("--depth", type=int, default=200)
    ap.add_argument("--output", type=int, default=32)
    ap.add_argument("--decode-batch", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, gmlx_serve([], Path(d), env={"GMLX_DECODE_BATCH": str(args.decode_batch)}
                                                         ) as s:
        for _ in range(2):  # warm-up, one stream at a time: loads the model and measures the width-1 rates
            measure(s.base_url, 1, args.depth, args.output)
        m = httpx.get(s.v1 + "/metrics", timeout=10).json()["server"]
        rates = Rates(m["rates"]["decode_tok_s_recent"], m["rates"]["prefill_tok_s_recent"])
        t0 = time.perf_counter()
        real = measure(s.base_url, args.width, args.depth, args.output)
        drain = time.perf_counter() - t0
    prompt_tokens = args.depth + 30  # the chat template adds about 30 tokens
    sim = simulate(Workload(1, args.width, prompt_tokens, args.output),
                   ServerSide(args.decode_batch, default_queue_cap(args.decode_batch)), rates)
    p_ttft = [o.first_token - o.first_arrival for o in sim.outcomes if o.first_token is not None]
    p_wait = [o.started - o.first_arrival for o in sim.outcomes if o.started is not None]
    m_ttft = [r["first"] for r in real]
    m_wait = [max(0.0, r["first"] - prompt_tokens / rates.prefill_tok_s) for r in real]  # TTFT less own prefill
    print(json.dumps({"rates": {"decode_tok_s": rates.decode_tok_s, "prefill_tok_s": rates.prefill_tok_s},
                      "width": args.width, "depth": prompt_tokens, "output": args.output}))
    rows = [("queue wait p50", statistics.median(p_wait), statistics.median(m_wait)),
            ("TTFT p50", statistics.median(p_ttft), statistics.median(m_ttft)),
            ("TTFT max", max(p_ttft), max(m_ttft)),
            ("drain", sim.drain_s, drain)]
    print(f"{'':16s} {'predicted':>10s} {'measured':>10s} {'measured/predicted':>19s}")
    for name, pred, meas in rows:
        ratio = meas / pred if pred > 0 else float("nan")
        print(f"{name:16s} {pred:9.2f}s {meas:9.2f}s {ratio:18.2f}x")


if __name__ == "__main__":
    main()
