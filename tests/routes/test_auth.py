"""API keys: every route in the app's route table but /health needs one; a client-scope key opens every route
but the operator ones (403 insufficient_scope there), an admin key opens all; each operator call is audited."""

from __future__ import annotations

import logging
import re
from dataclasses import replace

import pytest

from gmlx_server.app import ADMIN_PATHS, route_table
from gmlx_server.config import ApiKey
from tests.routes.conftest import Served, make_config, serve

KEY = "s3cret-key"
CLIENT_KEY, ADMIN_KEY = "client-key-1", "admin-key-2"
BODY = {"model": "m1", "prompt": "x", "messages": [{"role": "user", "content": "x"}]}


@pytest.fixture(scope="module")
def keyed() -> Served:
    return serve(make_config(api_key=KEY))


def _routes(s: Served) -> list[tuple[str, str]]:
    table = route_table(s.app)
    assert ("POST", "/v1/chat/completions") in table and ("GET", "/health") in table
    # The operator routes last: /unload before them would leave m1 unloaded, and the routes that read a
    # non-resident model's GGUF header (estimate, the tokenizer routes) cannot read the fake config's file.
    return sorted(((m, re.sub(r"\{[^}]*\}", "m1", p)) for m, p in table), key=lambda mp: mp[1] in ADMIN_PATHS)


def test_every_route_but_health_needs_the_key(keyed: Served) -> None:
    for method, path in _routes(keyed):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"},
                        {"Authorization": KEY}):
            r = keyed.client.request(method, path, headers=headers, json={})
            if path == "/health":
                assert r.status_code == 200
                continue
            assert r.status_code == 401, (method, path, headers)
            assert method == "HEAD" or r.json()["error"]["type"] == "authentication_error"  # HEAD: no body


def test_the_key_opens_every_route(keyed: Served) -> None:
    for method, path in _routes(keyed):
        for headers in ({"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}):
            r = keyed.client.request(method, path, headers=headers, json={"model": "m1", "prompt": "x",
                                                                           "messages": [{"role": "user",
                                                                                         "content": "x"}]})
            assert r.status_code != 401 and r.status_code < 500, (method, path, r.text)


@pytest.fixture(scope="module")
def scoped() -> Served:
    cfg = make_config()
    keys = (ApiKey("alice", CLIENT_KEY), ApiKey("ops", ADMIN_KEY, "admin"))
    return serve(replace(cfg, server=replace(cfg.server, api_keys=keys)))


def test_a_client_key_opens_all_but_the_operator_routes(scoped: Served) -> None:
    for method, path in _routes(scoped):
        for headers in ({"Authorization": f"Bearer {CLIENT_KEY}"}, {"x-api-key": CLIENT_KEY}):
            r = scoped.client.request(method, path, headers=headers, json=BODY)
            if path in ADMIN_PATHS:
                assert r.status_code == 403, (method, path, r.text)
                err = r.json()["error"]
                assert err["type"] == "insufficient_scope" and err["code"] == "insufficient_scope"
                assert "'alice'" in err["message"] and CLIENT_KEY not in r.text
            else:
                assert r.status_code not in (401, 403) and r.status_code < 500, (method, path, r.text)


def test_an_admin_key_opens_every_route(scoped: Served) -> None:
    for method, path in _routes(scoped):
        r = scoped.client.request(method, path, headers={"x-api-key": ADMIN_KEY}, json=BODY)
        assert r.status_code not in (401, 403) and r.status_code < 500, (method, path, r.text)


def test_wrong_keys_are_401_on_every_route(scoped: Served) -> None:
    for method, path in _routes(scoped):
        for headers in ({}, {"x-api-key": CLIENT_KEY + "x"}, {"Authorization": f"Bearer {ADMIN_KEY[:-1]}"}):
            r = scoped.client.request(method, path, headers=headers, json=BODY)
            assert r.status_code == (200 if path == "/health" else 401), (method, path, headers)


def test_the_anthropic_shape_of_a_scope_refusal(scoped: Served) -> None:
    r = scoped.client.post("/v1/cache/reset", headers={"x-api-key": CLIENT_KEY, "anthropic-version": "2023-06-01"},
                           json={})
    assert r.status_code == 403 and r.json()["error"]["type"] == "insufficient_scope"


def test_operator_actions_are_audited_by_key_name(scoped: Served, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="gmlx.audit"):
        assert scoped.client.post("/unload", headers={"x-api-key": ADMIN_KEY}, json={"model": "m1"}).status_code \
            == 200
        scoped.client.post("/unload", headers={"x-api-key": CLIENT_KEY}, json={"model": "m1"})
    lines = [r for r in caplog.records if r.name == "gmlx.audit"]
    assert [r.getMessage().split(" client=")[0] for r in lines] == ["audit key=ops", "audit key=alice"]
    ok, refused = (r.gmlx_fields for r in lines)  # type: ignore[attr-defined]
    assert ok["action"] == "POST /unload" and ok["target"] == "m1" and ok["status"] == 200
    assert ok["outcome"] == "ok" and ok["client"] == "127.0.0.1" and ok["event"] == "audit"
    assert refused["action"] == "POST /unload" and refused["status"] == 403 and refused["outcome"] == "refused"
    assert refused["target"] is None  # refused before its body was read
    assert not any(k in caplog.text for k in (CLIENT_KEY, ADMIN_KEY))


def test_no_key_configured_means_open(served: Served) -> None:
    assert served.client.get("/v1/models").status_code == 200
