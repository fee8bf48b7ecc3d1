"""Schemathesis drives every operation of GET /openapi.json against a live server (uvicorn on loopback):
no 5xx, and every answer conforms to the document (status, content type, error and success bodies).
Over fake engines in the fast suite; over the real engine on SmolLM2 (slow), with generations capped."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pytest
import schemathesis
from hypothesis import settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gmlx_server.app import create_app
from gmlx_server.config import RuntimeEnv, load_config
from gmlx_server.serving.model_host import ModelHost
from tests.conftest import smollm2_path
from tests.hostile.harness import FUZZ, serves_normally_at
from tests.routes.conftest import ThreadedServer, make_config, serve

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
CAPPED = ("max_tokens", "max_completion_tokens", "max_output_tokens")


@pytest.fixture(scope="module")
def fake_url() -> Iterator[str]:
    # Fake engines, but m1 names the real SmolLM2 file: the routes that read a non-resident model's header
    # (estimate, the tokenizer routes) find one, where /fake/m1.gguf would fail m1 for every later example.
    cfg = make_config(("m1",), env=RuntimeEnv(sse_keepalive_s=0.05))
    cfg = replace(cfg, models=MappingProxyType({m: replace(e, path=smollm2_path()) for m, e in cfg.models.items()}))
    s = serve(cfg)
    with ThreadedServer(s.app) as url:
        yield url
    s.client.close()


@pytest.fixture(scope="module")
def real_url() -> Iterator[str]:
    smollm2_path()  # skips without the embedded model
    host = ModelHost(load_config())
    with ThreadedServer(create_app(host.config, host=host)) as url:
        yield url
        serves_normally_at(url, host.config.server.default_model or "")


@pytest.fixture(scope="module")
def fake_api(fake_url: str) -> Any:
    return schemathesis.openapi.from_url(fake_url + "/openapi.json")


@pytest.fixture(scope="module")
def real_api(real_url: str) -> Any:
    return schemathesis.openapi.from_url(real_url + "/openapi.json")


def cap_generation(case: Any) -> None:
    """At most two tokens per generation, so that a valid body the schema allows stays cheap."""
    if isinstance(case.body, dict):
        for name in CAPPED:
            value = case.body.get(name)
            if value is None or (type(value) is int and value > 2):
                case.body[name] = 2


@schemathesis.pytest.from_fixture("fake_api").parametrize()
@settings(FUZZ, max_examples=15)
def test_every_operation_conforms(case: Any, fake_url: str) -> None:
    case.call_and_validate(base_url=fake_url, checks=CHECKS, timeout=60)


@pytest.mark.slow
@schemathesis.pytest.from_fixture("real_api").parametrize()
@settings(FUZZ, max_examples=10)
def test_every_operation_conforms_on_the_real_engine(case: Any, real_url: str) -> None:
    cap_generation(case)
    case.call_and_validate(base_url=real_url, checks=CHECKS, timeout=300)
