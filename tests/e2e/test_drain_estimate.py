"""The drain estimate that Retry-After and queue.eta_s carry is calibrated on the engine's measured pace: on a
real `gmlx serve`, a wave of requests drains within a factor of two of what the server predicted when the
last one arrived (a ratio, not a timing: both sides run on the same, possibly busy, machine)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.server import gmlx_serve

pytestmark = pytest.mark.slow
WIDTH, WAVE, OUTPUT = 2, 6, 16


def _body(i: int) -> dict[str, object]:
    return {"model": "smollm2", "messages": [{"role": "user", "content": f"Request {i}: tell me about ships."}],
            "max_tokens": OUTPUT, "temperature": 0, "logit_bias": {"2": -100}}


def _wave(base: str, n: int) -> tuple[float, float, dict[str, object]]:
    finished: list[float] = []

    def one(i: int) -> None:
        httpx.post(base + "/v1/chat/completions", json=_body(i), timeout=600).raise_for_status()
        finished.append(time.perf_counter())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    while True:
        server = httpx.get(base + "/v1/metrics", timeout=10).json()["server"]
        c = server["concurrency"]
        if c["in_flight"] + c["waiting"] >= n:
            t_eta = time.perf_counter()
            break
        time.sleep(0.02)
    for t in threads:
        t.join(600)
    return float(server["queue"]["eta_s"]), max(finished) - t_eta, server


def test_the_drain_estimate_matches_the_real_drain(tmp_path: Path) -> None:
    env = {"GMLX_DECODE_BATCH": str(WIDTH), "GMLX_QUEUE_DEPTH_CAP": str(WAVE)}
    with gmlx_serve([], tmp_path, env=env) as s:
        _wave(s.base_url, WIDTH)  # loads the model and measures the pace at full width
        predicted, measured, snap = _wave(s.base_url, WAVE)
        assert snap["queue"]["waiting"] == WAVE - WIDTH  # type: ignore[index]
        assert 0.5 <= measured / predicted <= 2.0, (predicted, measured)
