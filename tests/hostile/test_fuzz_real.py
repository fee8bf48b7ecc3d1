"""Hostile requests to every route of an app with the real engine on the embedded SmolLM2: no 5xx, a
typed body in the path's protocol shape, and the engine still serves a normal request afterwards.

In-process (httpx over ASGITransport), one model load for the module; the bodies' own generations
are one token long.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gmlx_server.app import create_app
from gmlx_server.config import DEFAULT_MODEL_ID, load_config
from gmlx_server.serving.model_host import ModelHost
from tests.conftest import smollm2_path
from tests.hostile.harness import FUZZ, ROUTES, Client, exercise, serves_normally
from tests.hostile.strategies import requests

pytestmark = pytest.mark.slow
MODEL = DEFAULT_MODEL_ID


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    smollm2_path()  # skips without the embedded model
    host = ModelHost(load_config())
    c = Client(create_app(host.config, host=host))
    serves_normally(c, MODEL)  # loads the model once, before any example
    yield c
    c.close()
    host.close()


@pytest.mark.parametrize(("method", "route"), ROUTES)
@settings(FUZZ, max_examples=30)
@given(data=st.data())
def test_no_hostile_request_gets_a_500(client: Client, method: str, route: str, data: st.DataObject) -> None:
    exercise(client, data.draw(requests(method, route, MODEL)), MODEL)


def test_the_engine_serves_after_the_whole_run(client: Client) -> None:
    serves_normally(client, MODEL)
