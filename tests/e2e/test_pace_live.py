"""The prefill pace counts computed tokens only, on a real `gmlx serve` (SmolLM2): a prompt-cache hit leaves it
where the cold prefill put it and shows up as a restore pace of its own, and est_ttft_s for a fresh cold prompt
right after the hit is the cold prompt at the cold pace (before, the hit's reused tokens read as 7,000 tok/s of
prefill and the estimate came out 9x optimistic). Structure is asserted; the one timing check is a ratio loose
enough for a loaded machine."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gmlx_plan.pace import prefill_from_json
from tests.e2e.server import gmlx_serve

pytestmark = pytest.mark.slow
WORDS = 560  # about 600 prompt tokens: two prefill chunks


def _body(topic: str) -> dict[str, Any]:
    text = f"Notes on {topic}. " + " ".join(f"{topic}{i % 7}" for i in range(WORDS // 2))
    return {"model": "smollm2", "messages": [{"role": "user", "content": text}], "max_tokens": 2, "temperature": 0}


def _paces(base: str) -> dict[str, Any]:
    rates = httpx.get(base + "/v1/metrics", timeout=10).json()["server"]["rates"]
    return dict(rates["by_model"]["smollm2"])


def _ttft(base: str, body: dict[str, Any]) -> float:
    """The client is made before the clock starts: its SSL context alone takes 50-130 ms of CPU."""
    with httpx.Client(timeout=300) as client:
        t0 = time.perf_counter()
        with client.stream("POST", base + "/v1/chat/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {") and '"content":"' in line.replace(" ", "") and '"content":""' not in line:
                    return time.perf_counter() - t0
    raise AssertionError("no token streamed")


def test_a_cache_hit_leaves_the_prefill_pace_and_the_cold_estimate_alone(tmp_path: Path) -> None:
    with gmlx_serve([], tmp_path) as s:
        usage = httpx.post(s.v1 + "/chat/completions", json=_body("harbour"), timeout=300).json()["usage"]
        cold = _paces(s.base_url)
        hit = httpx.post(s.v1 + "/chat/completions", json=_body("harbour"), timeout=300).json()["usage"]
        after = _paces(s.base_url)
        fresh = _body("lantern")
        est = httpx.post(s.v1 + "/estimate", json=fresh, timeout=60).json()
        real = _ttft(s.base_url, fresh)
    assert usage["prompt_tokens"] > 512 and hit["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] - 1
    assert cold["restore_tok_s"] is None and after["restore_tok_s"] is not None  # the hit is a restore, timed apart
    # The hit computed one token: the pace moves by that token's share, not by the 600 it reused.
    assert after["prefill_tok_s"] == pytest.approx(cold["prefill_tok_s"], rel=0.25)
    assert est["cache_tier"] == "miss" and est["warm_tokens"] == 0
    pace = prefill_from_json(after)
    assert pace is not None
    # Idle server: the estimate is the whole prompt at the cold pace (the queue ahead is empty).
    assert est["est_ttft_s"] == pytest.approx(pace.seconds(0, est["prompt_tokens"]), abs=0.002)
    print(f"cold TTFT right after a hit: real {real:.3f} s, est_ttft_s {est['est_ttft_s']:.3f} s, "
          f"real/est {real / est['est_ttft_s']:.2f}x")  # issue 35's target: within 25% (-s shows it)
    # Generous: the 9x-optimistic estimate stays out, a load swing between the estimate and the request stays in.
    assert 0.25 <= real / est["est_ttft_s"] <= 4.0, (real, est)
