"""Back-pressure on a real server and model: a bounded load test against a small queue cap, and the
memory governor shedding the largest stream under a small configured budget."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import smollm2_path
from tests.e2e.server import LiveServer, gmlx_serve

pytestmark = pytest.mark.slow
BODY = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4,
        "temperature": 0}


async def _fire(base: str, n: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(300)) as c:
        return list(await asyncio.gather(*[c.post("/v1/chat/completions", json=BODY) for _ in range(n)]))


def _poll_health(base: str, stop: threading.Event, codes: list[int]) -> None:
    with httpx.Client(base_url=base, timeout=10) as c:
        while not stop.is_set():
            codes.append(c.get("/health").status_code)
            time.sleep(0.1)


def test_64_requests_against_cap_8_all_complete_or_get_503_with_retry_after(tmp_path: Path) -> None:
    env = {"GMLX_QUEUE_DEPTH_CAP": "8", "GMLX_DECODE_BATCH": "4"}
    with gmlx_serve([], tmp_path, env=env) as s:
        httpx.post(s.v1 + "/chat/completions", json=BODY, timeout=300).raise_for_status()  # load the model
        stop, codes = threading.Event(), []
        poller = threading.Thread(target=_poll_health, args=(s.base_url, stop, codes))
        poller.start()
        try:
            responses = asyncio.run(asyncio.wait_for(_fire(s.base_url, 64), timeout=600))
        finally:
            stop.set()
            poller.join()
        ok = [r for r in responses if r.status_code == 200]
        busy = [r for r in responses if r.status_code == 503]
        assert len(ok) + len(busy) == 64, {r.status_code for r in responses}
        assert len(ok) >= 12  # 4 decoding + 8 queued were admitted at the least
        for r in busy:
            assert r.json()["error"]["type"] == "server_overloaded"
            assert 2 <= int(r.headers["Retry-After"]) <= 60
        for r in ok:
            assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
        assert codes and all(c == 200 for c in codes)  # /health answered throughout
        assert httpx.get(s.base_url + "/health", timeout=5).status_code == 200
        q = httpx.get(s.v1 + "/metrics", timeout=5).json()["server"]["queue"]
        assert q["rejections"] == len(busy) and q["waiting"] == 0


def _active_bytes_idle(tmp_path: Path) -> int:
    with gmlx_serve([], tmp_path) as s:
        httpx.post(s.v1 + "/chat/completions", json=BODY, timeout=300).raise_for_status()
        return int(httpx.get(s.v1 + "/metrics", timeout=5).json()["server"]["resident_models"][0]["active_bytes"])


def _stream(server: LiveServer, body: dict[str, object], out: dict[str, list[dict[str, object]]], key: str) -> None:
    events: list[dict[str, object]] = []
    with httpx.stream("POST", server.v1 + "/chat/completions", json={**body, "stream": True}, timeout=600) as r:
        if r.status_code != 200:
            events.append({"status": r.status_code, "body": r.read().decode()})
        for line in r.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
    out[key] = events


def test_governor_sheds_the_largest_stream_and_the_others_finish(tmp_path: Path) -> None:
    idle = _active_bytes_idle(tmp_path)
    # 150 MB over the idle working set; a ~4,200-token prompt's fp32 KV and prefill (~200 MB) pushes it red.
    budget = idle + 150_000_000
    cfg = tmp_path / "gmlx.yaml"
    cfg.write_text(f"server:\n  memory_budget: {budget}\n  decode_batch: 2\n"
                   f"models:\n  smollm2:\n    path: {smollm2_path()}\n")
    # The memory preflight would refuse the big prompt up front (it can never fit this budget): turn it off
    # so the governor meets the stream while it runs.
    with gmlx_serve(["--config", str(cfg)], tmp_path, env={"GMLX_PREFLIGHT_MEM": "0"}) as s:
        small = {**BODY, "max_tokens": 40, "logit_bias": {"2": -100}}
        big = {**BODY, "messages": [{"role": "user", "content": "Repeat after me. " + "lorem ipsum dolor " * 600}],
               "max_tokens": 200, "logit_bias": {"2": -100}}
        out: dict[str, list[dict[str, object]]] = {}
        threads = [threading.Thread(target=_stream, args=(s, small, out, "small")),
                   threading.Thread(target=_stream, args=(s, big, out, "big"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        big_finish = [c["choices"][0]["finish_reason"] for c in out["big"] if c.get("choices")  # type: ignore[index]
                      and c["choices"][0].get("finish_reason")]  # type: ignore[index]
        errors = [c["error"] for c in out["big"] if "error" in c]
        assert big_finish == ["shed"], out["big"][-3:]
        assert big_finish == ["shed"] and errors and errors[0]["type"] == "server_overloaded_shed"  # type: ignore[index]
        small_finish = [c["choices"][0]["finish_reason"] for c in out["small"] if c.get("choices")  # type: ignore[index]
                        and c["choices"][0].get("finish_reason")]  # type: ignore[index]
        assert small_finish == ["length"]
        gov = httpx.get(s.v1 + "/metrics", timeout=5).json()["server"]["governor"]
        assert gov["sheds"] >= 1 and gov["band_changes"]["red"] >= 1
