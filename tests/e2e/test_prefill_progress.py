"""Prefill progress on a real `gmlx serve` with SmolLM2: while a long prompt prefills (chunks of 512 tokens), its
/v1/metrics row's `position` counts the prompt tokens done, refreshed per chunk, with an ETA from the
measured pace that gmlx top draws as a bar, Prometheus shows the tokens still to prefill, and a stream's
keep-alive comments say how far."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gmlx_top.view import request_cells
from tests.e2e.server import LiveServer, gmlx_serve

pytestmark = pytest.mark.slow
WORDS = 1000  # about 2.9K tokens of SmolLM2: six chunks


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with gmlx_serve([], tmp_path_factory.mktemp("prefill"), env={"GMLX_SSE_KEEPALIVE_S": "0.5"}) as s:
        yield s


def test_a_long_prefill_shows_its_progress_eta_and_tokens_in_flight(server: LiveServer) -> None:
    prompt = " ".join(f"w{i % 97}" for i in range(WORDS))
    done: dict[str, Any] = {}

    def ask() -> None:
        done["r"] = httpx.post(server.v1 + "/chat/completions", timeout=600, json={
            "model": "smollm2", "max_tokens": 1, "messages": [{"role": "user", "content": prompt}]})

    worker = threading.Thread(target=ask)
    worker.start()
    rows: list[dict[str, Any]] = []
    gauges: list[float] = []
    while worker.is_alive():
        snap = httpx.get(server.v1 + "/metrics", timeout=30).json()
        rows += [r for r in snap["server"]["requests"] if r["state"] == "prefill"]
        text = httpx.get(server.v1 + "/metrics", params={"format": "prometheus"}, timeout=30).text
        found = re.search(r"^gmlx_prefill_tokens_in_flight (\S+)$", text, re.M)
        assert found is not None
        gauges.append(float(found.group(1)))
        time.sleep(0.1)
    worker.join()
    total = done["r"].json()["usage"]["prompt_tokens"]
    positions = [r["position"] for r in rows]
    assert len(set(positions)) >= 2, rows  # refreshed chunk by chunk, not only at the end
    assert all(0 <= p <= total for p in positions), positions
    assert positions == sorted(positions)
    assert any(r["prefill_eta_s"] is not None and r["prefill_eta_s"] > 0 for r in rows), rows
    # gmlx top's pos column for these live rows: a bar, the share done and the ETA from the measured pace
    drawn = [request_cells(r)[4] for r in rows if r["prefill_eta_s"]]
    assert drawn and all(re.fullmatch(r"[█░]+ \d+% [\d.]+s", cell) for cell in drawn), drawn
    assert 0 < max(gauges) <= total  # the tokens still to prefill, while it prefilled


def test_a_streams_keepalive_comments_carry_the_prefill_progress(server: LiveServer) -> None:
    prompt = " ".join(f"v{i % 89}" for i in range(WORDS))  # not the other test's prompt: no cache hit
    comments: list[str] = []
    with httpx.stream("POST", server.v1 + "/chat/completions", timeout=600, json={
            "model": "smollm2", "max_tokens": 1, "stream": True,
            "messages": [{"role": "user", "content": prompt}]}) as r:
        comments = [line for line in r.iter_lines() if line.startswith(":")]
    progress = [tuple(map(int, m.groups())) for c in comments
                if (m := re.fullmatch(r": keepalive prefill (\d+)/(\d+)", c))]
    assert progress, comments  # the 0.5 s keep-alive fired while it prefilled, and said how far
    assert all(0 <= done <= total for done, total in progress) and len({t for _, t in progress}) == 1
