"""What every hostile request must get back, and a client that cannot hang a test run.

The contract: no 5xx; an error body in the protocol's shape for its path (Anthropic under
/v1/messages, OpenAI elsewhere); a success body that parses; and afterwards the engine still
answers a normal request.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import httpx
from hypothesis import HealthCheck, settings

from gmlx_server.app import GmlxApp, create_app, route_table
from gmlx_server.protocol.error_bodies import is_anthropic
from tests.fakes import FakeFactory
from tests.hostile.strategies import Hostile
from tests.routes.conftest import make_config

# (method, path) of every responder: the same for any config, so an app over fakes lists them.
ROUTES = sorted(route_table(create_app(make_config(("m1",)), FakeFactory(), check_headers=False)))
# Reproducible runs in CI; big hostile values and a real engine make examples slow and large.
FUZZ = settings(deadline=None, derandomize=True, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large,
    HealthCheck.large_base_example, HealthCheck.filter_too_much])
REQUEST_LIMIT_S = 300.0  # a hung request (a dead engine thread) fails the test instead of stalling CI
# Routes whose success means the engine ran this request: the engine must still serve the next one.
ENGINE_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses", "/v1/keep")


class Client:
    """httpx over ASGITransport on one persistent loop (engines keep loop-bound state)."""

    def __init__(self, app: GmlxApp) -> None:
        self.runner = asyncio.Runner()
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=cast(Any, app)), base_url="http://gmlx")

    def send(self, req: Hostile) -> httpx.Response:
        headers = {"content-type": "application/json"} if req.body is not None else {}
        call = self.client.request(req.method, req.path, content=req.body, headers=headers)
        try:
            return self.runner.run(asyncio.wait_for(call, REQUEST_LIMIT_S))
        except TimeoutError:
            raise AssertionError(f"no answer in {REQUEST_LIMIT_S} s to {req!r}") from None

    def close(self) -> None:
        self.runner.run(self.client.aclose())
        self.runner.close()


def check(req: Hostile, r: httpx.Response) -> None:
    """No 5xx, a typed error in the path's protocol shape, a parseable success."""
    assert r.status_code < 500, f"{r.status_code} for {req!r}: {r.text[:500]}"
    assert "Traceback" not in r.text
    ctype = r.headers.get("content-type", "")
    if req.method == "HEAD":
        assert r.content == b""
    elif r.status_code >= 400:
        assert ctype.startswith("application/json"), (req, ctype)
        check_error_body(req.path, r.json())
    elif ctype.startswith("application/json"):
        json.loads(r.content)
    elif ctype.startswith("text/event-stream"):
        assert r.text.rstrip().endswith(("[DONE]", "}")), r.text[-300:]
    else:
        assert ctype.startswith("text/plain"), ctype  # Prometheus exposition


def check_error_body(path: str, body: Any) -> None:
    if is_anthropic(path.split("?")[0]):
        assert body.get("type") == "error", body
        err = body["error"]
        assert isinstance(err.get("type"), str) and isinstance(err.get("message"), str), body
        return
    err = body["error"]
    assert {"message", "type", "param", "code"} <= set(err), body
    assert isinstance(err["message"], str) and isinstance(err["type"], str), body
    assert err["param"] is None or isinstance(err["param"], str), body


NORMAL = {"max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": "Say hi."}]}


def serves_normally(client: Client, model: str) -> None:
    """A plain one-token chat answers 200: whatever came before did not break the engine."""
    r = client.send(Hostile("POST", "/v1/chat/completions", json.dumps({"model": model, **NORMAL}).encode()))
    _normal_answer(r)


def serves_normally_at(base_url: str, model: str) -> None:
    """The same over real HTTP, for a live server."""
    _normal_answer(httpx.post(base_url + "/v1/chat/completions", json={"model": model, **NORMAL},
                              timeout=REQUEST_LIMIT_S))


def _normal_answer(r: httpx.Response) -> None:
    assert r.status_code == 200, r.text[:500]
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] in ("length", "stop") and isinstance(choice["message"]["content"], str)


def exercise(client: Client, req: Hostile, model: str) -> httpx.Response:
    """Send one hostile request and hold the server to the contract (a normal request after one that
    reached an engine)."""
    r = client.send(req)
    check(req, r)
    if r.status_code < 300 and req.path.split("?")[0] in ENGINE_ROUTES:
        serves_normally(client, model)
    return r
