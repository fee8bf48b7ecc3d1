"""keep_alive and ttl over HTTP on fake engines: every generation route, count_tokens and /v1/keep set a model's
lifetime; the idle sweep honours it; /v1/models and /v1/metrics show it; bad values are typed 400s."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.routes.test_residency import Sized, sized

HI = [{"role": "user", "content": "hi"}]
ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"messages": HI}),
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/messages", {"messages": HI, "max_tokens": 4}),
    ("/v1/responses", {"input": "hi"}),
    ("/v1/messages/count_tokens", {"messages": HI}),
]


@pytest.fixture
def z() -> Iterator[Sized]:
    out = sized({"a": 10, "b": 10, "p": 10}, pinned=("p",), idle_timeout_s=60)
    yield out
    out.s.client.close()


def generate(z: Sized, route: int = 0, model: str = "a", **fields: Any) -> httpx.Response:
    path, body = ROUTES[route]
    return z.post(path, {"model": model, **body, **fields})


def sweep(z: Sized, after_s: float) -> list[str]:
    z.clock.advance(after_s)
    return z.s.client.runner.run(z.host.sweep())


def listed(z: Sized) -> dict[str, dict[str, Any]]:
    return {m["id"]: m for m in z.s.client.get("/v1/models").json()["data"]}


@pytest.mark.parametrize("route", range(len(ROUTES)))
def test_every_route_sets_the_lifetime_and_it_outlives_the_idle_timeout(z: Sized, route: int) -> None:
    assert generate(z, route, keep_alive="10m").status_code == 200
    assert sweep(z, 61) == []  # past the 60 s idle timeout
    lifetime = {"source": "request", "keep_alive_s": 600.0, "expires_in_s": 539.0}
    assert listed(z)["a"]["lifetime"] == lifetime and z.resident()["a"]["lifetime"] == lifetime
    assert generate(z, route, ttl=5).status_code == 200  # LM Studio's word; the latest request's value wins
    assert sweep(z, 5) == ["a"] and listed(z)["a"]["lifetime"] is None


def test_a_request_without_one_leaves_the_lifetime_as_it_stands(z: Sized) -> None:
    generate(z, keep_alive=-1)
    generate(z)
    assert sweep(z, 10**6) == [] and z.resident()["a"]["lifetime"]["keep_alive_s"] is None


def test_zero_unloads_once_the_answer_is_done_but_not_while_another_request_streams(z: Sized) -> None:
    generate(z)
    generate(z, keep_alive=0)
    z.engine("a").waiting = 1  # another client's request is still queued on it
    assert sweep(z, 1) == [] and "a" in z.host.resident
    z.engine("a").waiting = 0
    assert sweep(z, 0) == ["a"] and z.engine("a").closed
    assert generate(z).status_code == 200 and listed(z)["a"]["lifetime"]["source"] == "idle_timeout"


def test_a_pin_outlives_a_zero(z: Sized) -> None:
    generate(z, model="p", keep_alive=0)
    assert sweep(z, 10**6) == [] and z.resident()["p"]["lifetime"] == {
        "source": "pinned", "keep_alive_s": None, "expires_in_s": None}


def test_models_not_resident_have_no_lifetime(z: Sized) -> None:
    assert all(row["lifetime"] is None for row in listed(z).values())


@pytest.mark.parametrize("route", range(len(ROUTES)))
def test_malformed_values_are_a_400_naming_the_field_in_the_protocols_shape(z: Sized, route: int) -> None:
    anthropic = ROUTES[route][0].startswith("/v1/messages")
    for fields, param in (({"keep_alive": "soon"}, "keep_alive"), ({"ttl": True}, "ttl"),
                          ({"keep_alive": "5m", "ttl": 300}, "ttl")):
        r = generate(z, route, **fields)
        assert r.status_code == 400, (fields, r.text)
        err = r.json()["error"]
        assert (err["type"] == "invalid_request_error") and f"'{param}'" in err["message"], err
        assert anthropic or err["param"] == param
    assert "a" not in z.host.resident  # refused before any model loads


def test_keep_with_a_keep_alive_loads_and_warms_without_keeping(z: Sized) -> None:
    body = z.post("/v1/keep", {"model": "a", "keep_alive": "1h"}).json()
    assert body["resident"] and body["warm_s"] is not None and body["kept"] is False
    assert body["lifetime"] == {"source": "request", "keep_alive_s": 3600.0, "expires_in_s": 3600.0}
    assert sweep(z, 3599) == [] and sweep(z, 1) == ["a"]


def test_keep_with_zero_loads_nothing_and_unloads_a_resident_model_once_idle(z: Sized) -> None:
    body = z.post("/v1/keep", {"model": "b", "ttl": 0}).json()
    assert body["resident"] is False and "b" not in z.s.factory.engines
    z.post("/v1/keep", {"model": "a"})
    body = z.post("/v1/keep", {"model": "a", "keep_alive": 0}).json()
    assert body["kept"] is False and body["lifetime"]["source"] == "request"
    assert sweep(z, 0) == ["a"]


def test_keep_refuses_a_keep_beside_a_keep_alive_and_bad_values(z: Sized) -> None:
    for body, param in (({"keep": True, "keep_alive": "5m"}, "keep"), ({"keep_alive": [5]}, "keep_alive"),
                        ({"keep_alive": 5, "ttl": 5}, "ttl")):
        r = z.post("/v1/keep", {"model": "a", **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert "a" not in z.host.resident
    body = z.post("/v1/keep", {"model": "a", "keep": False, "keep_alive": "5m"}).json()
    assert body["resident"] and body["lifetime"]["keep_alive_s"] == 300.0
