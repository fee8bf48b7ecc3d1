"""Hostile requests to every route of an app over the fake engine: the fast variant, run with every
suite (the real-engine one is test_fuzz_real.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gmlx_server.app import create_app
from tests.fakes import FakeFactory
from tests.hostile.harness import FUZZ, ROUTES, Client, exercise, serves_normally
from tests.hostile.strategies import covered, requests
from tests.routes.conftest import make_config

MODEL = "m1"
# Routes that read a non-resident model's GGUF header instead of loading it: the fake config's file does not
# exist (a 503 model_load_failed), so they are fuzzed with m1 resident, as the real-engine run has it.
HEADER_READERS = ("/v1/estimate", *(p + r for r in ("/tokenize", "/detokenize", "/apply-template")
                                    for p in ("", "/v1")))


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    c = Client(create_app(make_config((MODEL,)), FakeFactory(), check_headers=False))
    yield c
    c.close()


def test_every_route_has_a_strategy() -> None:
    assert [r for r in ROUTES if not covered(*r)] == []


@pytest.mark.parametrize(("method", "route"), ROUTES)
@settings(FUZZ, max_examples=40)
@given(data=st.data())
def test_no_hostile_request_gets_a_500(client: Client, method: str, route: str, data: st.DataObject) -> None:
    if route in HEADER_READERS:
        serves_normally(client, MODEL)  # resident (an earlier /unload example may have unloaded it)
    exercise(client, data.draw(requests(method, route, MODEL)), MODEL)
