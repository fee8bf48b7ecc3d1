"""The httpx side of `gmlx top` against a mock transport: URLs, the API key, typed errors, actions."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import httpx
import pytest

from gmlx_top.client import ApiError, HttpClient, normalize_url
from tests.top.fakes import recorded

Seen = list[tuple[str, str, Any, str | None]]


def _client(handler: Any, api_key: str | None = None) -> tuple[HttpClient, Seen]:
    seen: Seen = []

    def record(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        seen.append((request.method, request.url.path, body, request.headers.get("authorization")))
        result: httpx.Response = handler(request)
        return result

    return HttpClient("127.0.0.1:9999/v1/", api_key, transport=httpx.MockTransport(record)), seen


@pytest.mark.parametrize("given, root", [
    (None, "http://127.0.0.1:8080"), ("localhost:8080", "http://localhost:8080"),
    ("https://box.lan:443/", "https://box.lan:443"), ("http://h:1/v1", "http://h:1"),
])
def test_urls_normalize_to_the_server_root(given: str | None, root: str) -> None:
    assert normalize_url(given) == root


def test_fetch_sends_the_key_and_returns_the_snapshot() -> None:
    client, seen = _client(lambda r: httpx.Response(200, json=recorded("idle")), api_key="s3cret")
    body = asyncio.run(client.fetch())
    assert body["server"]["resident_models"][0]["id"] == "smollm2"
    assert seen == [("GET", "/v1/metrics", None, "Bearer s3cret")]
    assert client.base_url == "http://127.0.0.1:9999"


@pytest.mark.parametrize("response, kind", [
    (httpx.Response(401, json={"error": {"type": "authentication_error", "message": "invalid API key"}}),
     "authentication_error"),
    (httpx.Response(502, text="bad gateway"), "http_error"),
    (httpx.Response(200, json={"no": "server"}), "bad_snapshot"),
])
def test_fetch_raises_typed_errors(response: httpx.Response, kind: str) -> None:
    client, _ = _client(lambda r: response)
    with pytest.raises(ApiError) as err:
        asyncio.run(client.fetch())
    assert err.value.type == kind and err.value.status == response.status_code


def test_fetch_lets_transport_errors_through_for_the_reconnect_loop() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client, _ = _client(down)
    with pytest.raises(httpx.ConnectError):
        asyncio.run(client.fetch())


def test_actions_post_the_model_to_each_route() -> None:
    client, seen = _client(lambda r: httpx.Response(200, json={"status": "ok"}))
    for kind in ("unload", "keep", "release", "reset"):
        result = asyncio.run(client.action(kind, "smollm2"))  # type: ignore[arg-type]
        assert result.ok and result.status == 200
    assert [(m, p, b) for m, p, b, _ in seen] == [
        ("POST", "/unload", {"model": "smollm2"}), ("POST", "/v1/keep", {"model": "smollm2"}),
        ("POST", "/v1/keep", {"model": "smollm2", "keep": False}), ("POST", "/v1/cache/reset", {"model": "smollm2"}),
    ]


@pytest.mark.parametrize("status, kind", [(404, "not_found_error"), (501, "not_implemented"), (409, "model_busy")])
def test_a_refused_action_carries_the_servers_typed_error(status: int, kind: str) -> None:
    answer = httpx.Response(status, json={"error": {"type": kind, "message": "nope"}})
    client, _ = _client(lambda r: answer)
    result = asyncio.run(client.action("unload", "smollm2"))
    assert not result.ok and result.status == status
    assert f"{status} {kind}: nope" in result.message
    assert ("no such route" in result.message) == (status in (404, 501))


def test_an_unreachable_server_is_an_action_result_not_an_exception() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client, _ = _client(down)
    result = asyncio.run(client.action("reset", "m"))
    assert not result.ok and result.status == 0 and "unreachable" in result.message


def test_the_client_and_view_load_without_textual() -> None:
    code = "import sys, gmlx_top.client, gmlx_top.view, gmlx_top.cli; sys.exit('textual' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
