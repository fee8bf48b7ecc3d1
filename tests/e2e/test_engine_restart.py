"""A real `gmlx serve` whose engine thread is killed outright recovers by itself: the requests the engine held
end with a typed error (streamed and not), readiness says `restarting`, a request meanwhile gets a typed 503
with Retry-After, and the host reloads the engine after its backoff and serves again. The killer is planted
from outside the product, through a sitecustomize module on the server's PYTHONPATH: gmlx has no fault hook.

Also the request that once killed the engine (`seed: -1`) through the official openai SDK."""

from __future__ import annotations

import json
import os
import threading
import time

import httpx
import openai
import pytest

from tests.e2e.server import LiveServer, gmlx_serve

pytestmark = pytest.mark.slow
KILL_MARK = 4321  # a request with this max_tokens kills the engine thread when it reaches the scheduler

HOOK = f"""
import gmlx_server.engine.scheduler as s

_real = s.Scheduler._start_prefill

def _start_prefill(self):
    if any(j.request.max_tokens == {KILL_MARK} for j in self.waiting):
        raise SystemExit("planted by the test: the engine thread is killed")
    _real(self)

s.Scheduler._start_prefill = _start_prefill
"""
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hello."}], "temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> LiveServer:
    tmp = tmp_path_factory.mktemp("restart")
    (tmp / "hook").mkdir()
    (tmp / "hook" / "sitecustomize.py").write_text(HOOK)
    path = os.pathsep.join(p for p in (str(tmp / "hook"), os.environ.get("PYTHONPATH", "")) if p)
    with gmlx_serve([], tmp, env={"PYTHONPATH": path, "GMLX_DECODE_BATCH": "2"}) as s:
        yield s  # type: ignore[misc]


def _stream(server: LiveServer, body: dict[str, object], out: dict[str, list[dict[str, object]]]) -> None:
    events: list[dict[str, object]] = []
    with httpx.stream("POST", server.v1 + "/chat/completions", json={**body, "stream": True}, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
    out["stream"] = events


def _wait_decoding(server: LiveServer) -> None:
    deadline = time.monotonic() + 60
    while not any(r.get("state") == "decode" and r.get("generated", 0) > 0 for r in
                  httpx.get(server.v1 + "/metrics", timeout=5).json()["server"]["requests"]):
        assert time.monotonic() < deadline, "the stream never started decoding"
        time.sleep(0.05)


def _client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="none", max_retries=0, timeout=120)


def test_seed_minus_one_and_a_huge_top_k_are_answered(server: LiveServer) -> None:
    client = _client(server)
    for seed in (-1, -(2**63), 2**64 - 1):
        r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=3, seed=seed, extra_body={"top_k": 10**9})
        assert r.choices[0].finish_reason in ("stop", "length")
    hi = {**CHAT, "messages": [{"role": "user", "content": "Hi"}]}  # CHAT's prompt stays cold for the next test
    assert client.chat.completions.create(**hi, max_tokens=3).choices[0].message.content  # type: ignore[call-overload]


def test_a_killed_engine_fails_its_requests_and_the_host_restarts_it(server: LiveServer) -> None:
    client = _client(server)
    before = client.chat.completions.create(**CHAT, max_tokens=6).choices[0].message.content  # type: ignore[call-overload]
    out: dict[str, list[dict[str, object]]] = {}
    long = {**CHAT, "max_tokens": 2000, "logit_bias": {"2": -100}}  # EOS banned: still decoding when killed
    streamer = threading.Thread(target=_stream, args=(server, long, out))
    streamer.start()
    _wait_decoding(server)
    with pytest.raises(openai.InternalServerError) as killed:
        client.chat.completions.create(**CHAT, max_tokens=KILL_MARK)
    assert killed.value.status_code == 500 and killed.value.body["type"] == "engine_error"  # type: ignore[index]
    assert "engine stopped" in killed.value.body["message"]  # type: ignore[index]
    streamer.join(60)
    assert not streamer.is_alive()
    assert out["stream"][-1].get("error", {}).get("type") == "engine_error", out["stream"][-2:]  # type: ignore[union-attr]

    ready = httpx.get(server.base_url + "/health?ready=1", timeout=5)
    assert ready.status_code == 503 and ready.json()["reason"] == "restarting"
    assert int(ready.headers["Retry-After"]) >= 1
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(**CHAT, max_tokens=6)
    assert refused.value.status_code == 503 and refused.value.body["type"] == "engine_restarting"  # type: ignore[index]
    assert int(refused.value.response.headers["Retry-After"]) >= 1

    deadline = time.monotonic() + 90
    while httpx.get(server.base_url + "/health?ready=1", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, server.log()[-3000:]
        time.sleep(0.2)
    after = client.chat.completions.create(**CHAT, max_tokens=6).choices[0].message.content  # type: ignore[call-overload]
    # greedy, and cold both times: the reloaded engine answers as the first one did (a prompt-cache hit would not
    # be held to this: under float16 KV a near-tie can part from the cold run's token)
    assert after == before
    row = httpx.get(server.v1 + "/metrics", timeout=5).json()["server"]["resident_models"][0]
    assert row["restarts"] == 1 and row["loads"] == 2
    log = server.log()
    assert "the engine of model smollm2 stopped (SystemExit" in log and "is serving again" in log
