"""/health keeps answering while a real `gmlx serve` (the embedded SmolLM2) converts, renders and tokenizes
the largest inputs each route accepts, refuses the bodies that used to freeze it (a 30 MB count_tokens
body blocked /health for 49.7 s, 300k chat messages for 14.1 s), and prefills a long prompt.

The bound is generous, since the machine is shared: p99 under 0.5 s (or ten times the quiet p99 on a
loaded machine). The figures are printed (`-s`); bench/responsiveness.py prints the same table.
"""

from __future__ import annotations

import pytest

from tests.e2e.health_probe import Figures, Load, loads, prefill_load, quiet, under
from tests.e2e.server import LiveServer

pytestmark = pytest.mark.slow
BOUND_S = 0.5


@pytest.fixture(scope="module")
def server(default_server: LiveServer) -> tuple[LiveServer, Figures]:
    under(default_server.base_url, prefill_load("", 16))  # the model loads outside the figures
    return default_server, quiet(default_server.base_url)


def _check(server: tuple[LiveServer, Figures], load: Load) -> None:
    live, calm = server
    out = under(live.base_url, load)
    print(f"\n{load.name}: {out.status} in {out.seconds:.2f} s; /health quiet {calm}; under load {out.health}")
    assert out.status == load.status, out.body
    if out.status == 400:
        assert out.body["error"]["message"].startswith("prompt is too long"), out.body  # typed, agents compact
    assert not out.failures
    assert out.health.n >= 3  # polled during the request, not only around it
    assert out.health.p99 < max(BOUND_S, 10 * calm.p99), (load.name, str(out.health))


@pytest.mark.parametrize("load", loads(""), ids=lambda x: x.name)
def test_health_answers_while_large_inputs_are_handled(server: tuple[LiveServer, Figures], load: Load) -> None:
    _check(server, load)


def test_health_answers_during_a_long_prefill(server: tuple[LiveServer, Figures]) -> None:
    _check(server, prefill_load("", 800))


def test_the_server_still_generates_afterwards(server: tuple[LiveServer, Figures]) -> None:
    out = under(server[0].base_url, prefill_load("", 16))
    assert out.status == 200 and out.body["choices"][0]["finish_reason"] == "length"
    assert out.body["usage"]["prompt_tokens"] > 16


def test_the_largest_count_is_exact(server: tuple[LiveServer, Figures]) -> None:
    """Just inside the character bound, count_tokens counts what /v1/estimate counts: far over the window."""
    by_route: dict[str, int] = {}
    for load in loads(""):
        if load.status == 200:
            body = under(server[0].base_url, load).body
            by_route[load.path] = int(body.get("input_tokens", body.get("prompt_tokens", 0)))
    assert set(by_route) == {"/v1/messages/count_tokens", "/v1/estimate"}
    assert len(set(by_route.values())) == 1 and by_route["/v1/estimate"] > 8192, by_route
