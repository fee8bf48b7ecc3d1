"""The API key: every route in the app's route table but /health needs it."""

from __future__ import annotations

import re

import pytest

from gmlx_server.app import route_table
from tests.routes.conftest import Served, make_config, serve

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def keyed() -> Served:
    return serve(make_config(api_key=KEY))


def _routes(s: Served) -> list[tuple[str, str]]:
    table = route_table(s.app)
    assert ("POST", "/v1/chat/completions") in table and ("GET", "/health") in table
    return [(m, re.sub(r"\{[^}]*\}", "m1", p)) for m, p in table]


def test_every_route_but_health_needs_the_key(keyed: Served) -> None:
    for method, path in _routes(keyed):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"},
                        {"Authorization": KEY}):
            r = keyed.client.request(method, path, headers=headers, json={})
            if path == "/health":
                assert r.status_code == 200
                continue
            assert r.status_code == 401, (method, path, headers)
            assert r.json()["error"]["type"] == "authentication_error"


def test_the_key_opens_every_route(keyed: Served) -> None:
    for method, path in _routes(keyed):
        for headers in ({"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}):
            r = keyed.client.request(method, path, headers=headers, json={"model": "m1", "prompt": "x",
                                                                           "messages": [{"role": "user",
                                                                                         "content": "x"}]})
            assert r.status_code != 401 and r.status_code < 500, (method, path, r.text)


def test_no_key_configured_means_open(served: Served) -> None:
    assert served.client.get("/v1/models").status_code == 200
