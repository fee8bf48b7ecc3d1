"""A server several people share, on a real `gmlx serve` with SmolLM2 over real HTTP and the official SDKs:
named keys with scopes (a client key chats but gets 403 insufficient_scope on the operator routes), fair
shares (a key past its share gets 429s with Retry-After while another key's burst all completes), the audit
line of every operator action in the JSON log, per-key Prometheus series and request-log names, and a request's
priority overtaking queued batch work."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.conftest import smollm2_path
from tests.e2e.server import LiveServer, anthropic_client, gmlx_serve, openai_client

pytestmark = pytest.mark.slow
ALICE, BOB, OPS = "alice-secret-1", "bob-secret-2", "ops-secret-3"
CHAT = {"model": "smollm2", "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": "Count from one to twenty in words."}]}


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    d = tmp_path_factory.mktemp("shared")
    cfg = d / "gmlx.yaml"
    cfg.write_text("\n".join([
        "server:", "  api_keys:",
        f"    - {{name: alice, key: {ALICE}, max_concurrent: 1, max_queued: 1}}",
        f"    - {{name: bob, key: {BOB}}}",
        f"    - {{name: ops, key: {OPS}, scope: admin}}",
        "models:", "  smollm2:", f"    path: {smollm2_path()}", ""]))
    with gmlx_serve(["--config", str(cfg), "--log-format", "json"], d) as srv:
        yield srv


def post(server: LiveServer, key: str, path: str = "/v1/chat/completions", body: object = CHAT) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120)


def test_scopes_through_the_sdks(shared: LiveServer) -> None:
    chat = openai_client(shared, api_key=ALICE).chat.completions.create(
        model="smollm2", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert chat.choices[0].message.content is not None
    with pytest.raises(openai.PermissionDeniedError) as e:
        openai_client(shared, api_key=ALICE).post("/cache/reset", body={}, cast_to=object)
    assert e.value.code == "insufficient_scope"
    assert openai_client(shared, api_key=OPS).post("/cache/reset", body={}, cast_to=object) is not None
    with pytest.raises(openai.AuthenticationError):
        openai_client(shared, api_key="nobody").models.list()
    msg = anthropic_client(shared, api_key=BOB).messages.create(
        model="smollm2", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert msg.content[0].type == "text"
    with pytest.raises(anthropic.PermissionDeniedError):
        anthropic_client(shared, api_key=BOB).post("/unload", body={"model": "smollm2"}, cast_to=object)
    with pytest.raises(anthropic.AuthenticationError):
        anthropic_client(shared, api_key=BOB + "x").messages.create(
            model="smollm2", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])


def test_each_key_keeps_its_share(shared: LiveServer) -> None:
    with ThreadPoolExecutor(10) as pool:
        alice = [pool.submit(post, shared, ALICE) for _ in range(6)]
        bob = [pool.submit(post, shared, BOB) for _ in range(4)]
        a, b = [f.result() for f in alice], [f.result() for f in bob]
    assert [r.status_code for r in b] == [200] * 4  # the other key's burst all completes
    statuses = Counter(r.status_code for r in a)
    assert statuses[200] >= 2 and statuses[429] >= 3 and set(statuses) == {200, 429}, statuses
    refused = next(r for r in a if r.status_code == 429)
    err = refused.json()["error"]
    assert err["type"] == "rate_limited" and "key 'alice'" in err["message"] and ALICE not in refused.text
    assert int(refused.headers["Retry-After"]) >= 1
    prom = httpx.get(shared.v1 + "/metrics?format=prometheus", headers={"x-api-key": OPS}).text
    assert f'gmlx_key_requests_total{{key="alice",status="429"}} {float(statuses[429])}' in prom
    assert 'gmlx_key_tokens_total{key="bob",kind="generated"}' in prom
    lines = [json.loads(x) for x in shared.log().splitlines() if x.startswith("{")]
    requests = [x for x in lines if x.get("logger") == "gmlx.request"]
    assert {x.get("key") for x in requests} >= {"alice", "bob"}
    assert ALICE not in shared.log() and BOB not in shared.log()  # names are logged, never keys


def test_operator_actions_leave_an_audit_line(shared: LiveServer) -> None:
    assert post(shared, OPS, "/v1/keep", {"model": "smollm2", "seconds": 60}).status_code == 200
    assert post(shared, ALICE, "/v1/reload", {}).status_code == 403
    lines = [json.loads(x) for x in shared.log().splitlines() if x.startswith("{")]
    audit = [x for x in lines if x.get("event") == "audit"]
    keep = next(x for x in audit if x["action"] == "POST /v1/keep")
    assert keep["key"] == "ops" and keep["client"] == "127.0.0.1" and keep["target"] == "smollm2"
    assert keep["status"] == 200 and keep["outcome"] == "ok" and keep["logger"] == "gmlx.audit"
    reload = next(x for x in audit if x["action"] == "POST /v1/reload")
    assert reload["key"] == "alice" and reload["status"] == 403 and reload["outcome"] == "refused"


@pytest.fixture(scope="module")
def one_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    d = tmp_path_factory.mktemp("one-slot")
    env = {"GMLX_DECODE_BATCH": "1", "GMLX_QUEUE_DEPTH_CAP": "8"}
    with gmlx_serve([smollm2_path()], d, env=env) as srv:
        yield srv


def finished_order(server: LiveServer, log_from: int) -> list[str]:
    """Request ids in the order their lines were logged (a line is written when the reply ends)."""
    ids = []
    for line in server.log()[log_from:].splitlines():
        if " gmlx.request: request id=" in line:
            ids.append(line.split(" id=")[1].split()[0])
    return ids


def test_an_interactive_request_overtakes_queued_batch_work(one_slot: LiveServer) -> None:
    url = one_slot.v1 + "/chat/completions"

    def run(priority: str, tokens: int) -> str:
        # <|im_end|> (id 2) is barred so each request runs its full length, however fast decode gets
        body = {**CHAT, "model": Path(smollm2_path()).stem, "max_tokens": tokens, "priority": priority,
                "logit_bias": {"2": -100}}
        r = httpx.post(url, json=body, timeout=120)
        assert r.status_code == 200, r.text
        return str(r.json()["id"])

    run("normal", 1)  # the model loads before the race begins
    start = len(one_slot.log())

    with ThreadPoolExecutor(5) as pool:
        first = pool.submit(run, "normal", 400)  # holds the only slot while the others queue behind it
        _wait_for_running(one_slot)
        batch = [pool.submit(run, "batch", 8) for _ in range(3)]
        _wait_for_waiting(one_slot, 3)
        interactive = pool.submit(run, "interactive", 8)
        ids = {"first": first.result(), "interactive": interactive.result(), **{
            f"batch{i}": f.result() for i, f in enumerate(batch)}}
    order = finished_order(one_slot, start)
    assert order.index(ids["interactive"]) < min(order.index(ids[f"batch{i}"]) for i in range(3)), order


def _metrics(server: LiveServer) -> dict[str, object]:
    return dict(httpx.get(server.v1 + "/metrics", timeout=10).json())


def _wait_for_running(server: LiveServer) -> None:
    _until(server, lambda m: any(r.get("state") in ("prefill", "decode") for r in _rows(m)))


def _wait_for_waiting(server: LiveServer, n: int) -> None:
    _until(server, lambda m: sum(r.get("state") == "queued" for r in _rows(m)) >= n)


def _rows(m: dict[str, object]) -> list[dict[str, object]]:
    server = m.get("server")
    rows = server.get("requests") if isinstance(server, dict) else None
    return rows if isinstance(rows, list) else []


def _until(server: LiveServer, ok: object, timeout_s: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(ok) and ok(_metrics(server)):
            return
        time.sleep(0.02)
    raise TimeoutError(f"the server never reached the state: {json.dumps(_metrics(server))[:2000]}")


def test_the_config_refuses_keys_named_twice(tmp_path: Path) -> None:
    cfg = tmp_path / "gmlx.yaml"
    cfg.write_text(f"server:\n  api_keys: [{{name: a, key: x1}}, {{name: a, key: x2}}]\nmodels:\n"
                   f"  smollm2: {{path: {smollm2_path()}}}\n")
    with pytest.raises(RuntimeError, match=r"server.api_keys\[1\].name"), gmlx_serve(
            ["--config", str(cfg)], tmp_path, timeout_s=60):
        pass
