"""Schemathesis drives every operation of GET /openapi.json against a live server (uvicorn on loopback,
fake engines): no 5xx, and every answer conforms to the document (status, content type, error body)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gmlx_server.config import RuntimeEnv
from tests.routes.conftest import ThreadedServer, make_config, serve

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def live_url() -> Iterator[str]:
    s = serve(make_config(("m1",), env=RuntimeEnv(sse_keepalive_s=0.05)))
    with ThreadedServer(s.app) as url:
        yield url
    s.client.close()


@pytest.fixture(scope="module")
def api(live_url: str) -> Any:
    return schemathesis.openapi.from_url(live_url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api")


@schema.parametrize()
@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much, HealthCheck.data_too_large])
def test_every_operation_conforms(case: Any, live_url: str) -> None:
    case.call_and_validate(base_url=live_url, checks=CHECKS, timeout=60)
