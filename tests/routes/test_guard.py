"""The request guard: Origin allowlist + CORS, Content-Type on JSON bodies, Host on loopback connections.

The in-process client puts the URL's host in the ASGI scope's `server`, so `http://127.0.0.1:8080/...`
is a loopback connection (Host checked) and `http://gmlx/...` stands for a LAN one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from gmlx_server.config import ServerSettings
from gmlx_server.routes.guard import CORS_HEADERS
from tests.routes.conftest import Served, make_config, serve, sse_events

LOOP = "http://127.0.0.1:8080"
CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
MSG = {"model": "m1", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
KEY = "k-123"


def _served(**server: Any) -> Served:
    cfg = make_config(api_key=server.pop("api_key", None))
    return serve(replace(cfg, server=replace(cfg.server, **server)))


@pytest.fixture(scope="module")
def s() -> Iterator[Served]:
    app = _served()
    yield app
    app.client.close()


def _openai_error(r: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    assert err["type"] == kind and err["code"] == kind
    return err


def _anthropic_error(r: httpx.Response, status: int, kind: str, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["code"] == code
    return dict(body["error"])


# --- Origin ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("origin", ["http://evil.example", "https://evil.example:8080", "null",
                                    "http://localhost.evil.example", "http://127.0.0.1.evil.example:80",
                                    "chrome-extension://abcdef", "not an origin"])
def test_a_foreign_origin_is_refused_on_every_kind_of_route(s: Served, origin: str) -> None:
    h = {"Origin": origin}
    for r in (s.client.post("/v1/chat/completions", json=CHAT, headers=h), s.client.get("/v1/models", headers=h),
              s.client.get("/health", headers=h), s.client.post("/v1/cache/reset", headers=h),
              s.client.post("/unload", content=b"{}", headers={**h, "Content-Type": "text/plain"})):
        err = _openai_error(r, 403, "origin_not_allowed")
        assert "server.allowed_origins" in err["message"] and "GMLX_ALLOWED_ORIGINS" in err["message"]
        assert "access-control-allow-origin" not in r.headers
        assert "Origin" in r.headers["vary"]


def test_a_foreign_origin_gets_the_anthropic_shape_under_messages(s: Served) -> None:
    r = s.client.post("/v1/messages", json=MSG, headers={"Origin": "http://evil.example"})
    err = _anthropic_error(r, 403, "permission_error", "origin_not_allowed")
    assert "evil.example" in err["message"]


def test_a_refused_page_generates_nothing() -> None:
    fresh = _served()
    r = fresh.client.post("/v1/chat/completions", json=CHAT, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and fresh.factory.calls == 0  # no engine was even created


@pytest.mark.parametrize("origin", ["http://localhost:5173", "http://127.0.0.1:3000", "http://[::1]:8080",
                                    "https://localhost", "HTTP://LOCALHOST:9"])
def test_loopback_origins_are_allowed_with_cors_headers(s: Served, origin: str) -> None:
    r = s.client.post("/v1/chat/completions", json=CHAT, headers={"Origin": origin})
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == origin
    assert "Retry-After" in r.headers["access-control-expose-headers"]
    assert "Origin" in r.headers["vary"]


def test_configured_origins_match_scheme_host_and_port() -> None:
    app = _served(allowed_origins=("https://app.example.com", "http://tools.lan:*", "null"))
    ok = ["https://app.example.com", "http://tools.lan", "http://tools.lan:8000", "null", "http://localhost:1"]
    bad = ["http://app.example.com", "https://app.example.com:8443", "https://x.app.example.com",
           "https://tools.lan", "http://evil.example"]
    for origin in ok:
        r = app.client.get("/v1/models", headers={"Origin": origin})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin, origin
    for origin in bad:
        assert app.client.get("/v1/models", headers={"Origin": origin}).status_code == 403, origin


def test_star_allows_any_origin() -> None:
    app = _served(allowed_origins=("*",))
    r = app.client.get("/v1/models", headers={"Origin": "https://anything.example"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://anything.example"


# --- CORS preflight --------------------------------------------------------------------------------

def _preflight(app: Served, origin: str, path: str = "/v1/chat/completions", **extra: str) -> httpx.Response:
    headers = {"Origin": origin, "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "content-type, authorization, x-stainless-os, x-custom-thing",
               **extra}
    return app.client.request("OPTIONS", path, headers=headers)


def test_preflight_for_an_allowed_origin_needs_no_key_and_lists_the_sdk_headers() -> None:
    keyed = _served(api_key=KEY)
    for path in ("/v1/chat/completions", "/v1/messages", "/v1/models", "/health"):
        r = _preflight(keyed, "http://localhost:3000", path)
        assert r.status_code == 204, r.text
        assert r.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert "POST" in r.headers["access-control-allow-methods"]
        allowed = {h.strip() for h in r.headers["access-control-allow-headers"].split(",")}
        assert set(CORS_HEADERS) <= allowed and "x-custom-thing" in allowed
        assert {"authorization", "x-api-key", "content-type", "anthropic-version", "anthropic-beta",
                "x-stainless-os"} <= allowed
        assert int(r.headers["access-control-max-age"]) > 0
        assert "Origin" in r.headers["vary"] and "access-control-allow-private-network" not in r.headers
    r = _preflight(keyed, "http://localhost:3000", **{"Access-Control-Request-Private-Network": "true"})
    assert r.headers["access-control-allow-private-network"] == "true"
    # The real request after the preflight still needs the key; its 401 is readable by the page.
    r = keyed.client.post("/v1/chat/completions", json=CHAT, headers={"Origin": "http://localhost:3000"})
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
    r = keyed.client.post("/v1/chat/completions", json=CHAT,
                          headers={"Origin": "http://localhost:3000", "Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"


def test_preflight_from_a_foreign_origin_is_refused(s: Served) -> None:
    r = _preflight(s, "https://evil.example")
    _openai_error(r, 403, "origin_not_allowed")
    assert "access-control-allow-origin" not in r.headers and "access-control-allow-methods" not in r.headers


def test_preflight_ignores_malformed_requested_header_names(s: Served) -> None:
    r = _preflight(s, "http://localhost", **{"Access-Control-Request-Headers": "x-ok, bad header, (x)"})
    allowed = {h.strip() for h in r.headers["access-control-allow-headers"].split(",")}
    assert "x-ok" in allowed and "bad header" not in allowed and "(x)" not in allowed


def test_a_stream_carries_the_cors_header(s: Served) -> None:
    r = s.client.post("/v1/chat/completions", json={**CHAT, "stream": True},
                      headers={"Origin": "http://localhost:5173"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["access-control-allow-origin"] == "http://localhost:5173"
    assert sse_events(r.text)[-1] == "[DONE]"


# --- Content-Type ----------------------------------------------------------------------------------

RAW = b'{"model": "m1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}'


def _post(app: Served, content_type: str | None, origin: str | None = None, path: str = "/v1/chat/completions",
          body: bytes = RAW) -> httpx.Response:
    headers = {k: v for k, v in (("Content-Type", content_type), ("Origin", origin)) if v is not None}
    return app.client.post(path, content=body, headers=headers)


@pytest.mark.parametrize("kind", ["text/plain", "text/plain;charset=UTF-8", "multipart/form-data; boundary=x",
                                  "application/xml", "text/html"])
def test_non_json_bodies_are_refused_with_or_without_origin(s: Served, kind: str) -> None:
    for origin in (None, "http://localhost:3000"):
        err = _openai_error(_post(s, kind, origin), 415, "unsupported_media_type")
        assert "application/json" in err["message"]
    r = _post(s, "text/plain", path="/v1/messages", body=b'{"model": "m1"}')
    _anthropic_error(r, 415, "invalid_request_error", "unsupported_media_type")


def test_json_with_parameters_and_json_suffix_types_pass(s: Served) -> None:
    for kind in ("application/json", "Application/JSON; charset=utf-8", "application/vnd.api+json"):
        for origin in (None, "http://localhost:3000"):
            assert _post(s, kind, origin).status_code == 200, (kind, origin)


def test_curl_style_bodies_pass_only_without_an_origin(s: Served) -> None:
    form = "application/x-www-form-urlencoded"
    assert _post(s, form).status_code == 200  # `curl URL -d '{...}'`, as the docs show
    assert _post(s, None).status_code == 200  # a client that names no type
    for kind in (form, None):  # a page's fetch() with a string or untyped Blob body
        r = _post(s, kind, "http://localhost:3000")
        err = _openai_error(r, 415, "unsupported_media_type")
        assert "Origin" in err["message"]


def test_an_empty_body_needs_no_content_type(s: Served) -> None:
    assert s.client.post("/v1/cache/reset", headers={"Content-Type": "text/plain"}).status_code == 200
    assert s.client.post("/unload").status_code == 200


def test_a_chunked_text_body_is_refused(s: Served) -> None:
    async def chunks() -> Any:  # no Content-Length: the guard must not take it for an empty body
        yield RAW

    r = s.client.post("/v1/chat/completions", content=chunks(), headers={"Content-Type": "text/plain"})
    _openai_error(r, 415, "unsupported_media_type")


# --- Host ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["evil.example:8080", "evil.example", "localhost.evil.example:8080",
                                  "127.0.0.1.nip.io:8080", "EVIL.example."])
def test_a_foreign_host_on_a_loopback_connection_is_refused(s: Served, host: str) -> None:
    for r in (s.client.get(f"{LOOP}/v1/models", headers={"Host": host}),
              s.client.get(f"{LOOP}/health", headers={"Host": host}),
              s.client.post(f"{LOOP}/v1/chat/completions", json=CHAT, headers={"Host": host})):
        err = _openai_error(r, 403, "host_not_allowed")
        assert "server.allowed_hosts" in err["message"] and "GMLX_ALLOWED_HOSTS" in err["message"]
    r = s.client.post(f"{LOOP}/v1/messages", json=MSG, headers={"Host": host})
    _anthropic_error(r, 403, "permission_error", "host_not_allowed")


@pytest.mark.parametrize("host", ["localhost:8080", "localhost", "LOCALHOST.:8080", "127.0.0.1:8080",
                                  "[::1]:8080", "app.localhost:8080", "192.168.1.5:8080", "10.0.0.1"])
def test_names_a_rebinding_page_cannot_forge_pass(s: Served, host: str) -> None:
    assert s.client.get(f"{LOOP}/v1/models", headers={"Host": host}).status_code == 200


def test_any_host_passes_on_a_non_loopback_connection_unless_names_are_configured(s: Served) -> None:
    assert s.client.get("http://gmlx/v1/models", headers={"Host": "gmlx.example.com"}).status_code == 200
    named = _served(allowed_hosts=("gmlx.lan",))
    for base in (LOOP, "http://gmlx"):
        assert named.client.get(f"{base}/v1/models", headers={"Host": "gmlx.lan:8080"}).status_code == 200
        assert named.client.get(f"{base}/v1/models", headers={"Host": "localhost:8080"}).status_code == 200
        r = named.client.get(f"{base}/v1/models", headers={"Host": "evil.example"})
        _openai_error(r, 403, "host_not_allowed")


def test_star_turns_the_host_check_off() -> None:
    app = _served(allowed_hosts=("*",))
    assert app.client.get(f"{LOOP}/v1/models", headers={"Host": "evil.example"}).status_code == 200


def test_ipv4_mapped_loopback_connections_are_checked(s: Served) -> None:
    r = s.client.get("http://[::ffff:127.0.0.1]:8080/v1/models", headers={"Host": "evil.example"})
    _openai_error(r, 403, "host_not_allowed")


# --- /health ---------------------------------------------------------------------------------------

def test_health_without_the_key_shows_no_pid_or_queue_figures() -> None:
    keyed = _served(api_key=KEY)
    assert keyed.client.get("/health").json() == {"status": "healthy"}
    assert keyed.client.get("/health", params={"ready": "1"}).json() == {"status": "healthy", "ready": True}
    keyed.chat(headers={"x-api-key": KEY})
    keyed.engine().waiting = 2
    r = keyed.client.get("/health", params={"ready": "1"}, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 503 and "Retry-After" in r.headers
    assert r.json() == {"status": "healthy", "ready": False, "reason": "queue"}
    full = keyed.client.get("/health", params={"ready": "1"}, headers={"x-api-key": KEY}).json()
    assert set(full) == {"status", "pid", "ready", "in_flight", "waiting", "reason"} and full["waiting"] == 2
    assert set(keyed.client.get("/health", headers={"Authorization": f"Bearer {KEY}"}).json()) == {"status", "pid"}


def test_health_without_a_configured_key_is_full(s: Served) -> None:
    assert set(s.client.get("/health", params={"ready": "1"}).json()) == {"status", "pid", "ready", "in_flight",
                                                                           "waiting"}


def test_head_health_answers_like_get_without_a_body(s: Served) -> None:
    r = s.client.request("HEAD", "/health")
    assert r.status_code == 200 and r.content == b"" and int(r.headers["content-length"]) > 0
    assert s.client.request("HEAD", "/health", params={"ready": "1"}).status_code == 200


def test_settings_default_to_loopback_only() -> None:
    assert ServerSettings().allowed_origins == () and ServerSettings().allowed_hosts == ()


def test_a_head_over_64_kib_is_a_typed_431(s: Served) -> None:
    r = s.client.get("/v1/models", headers={"X-Big": "a" * 70_000})
    err = _openai_error(r, 431, "request_header_fields_too_large")
    assert "65536" in err["message"]
    assert s.client.get("/v1/models", headers={"Cookie": "c=" + "a" * 30_000}).status_code == 200
