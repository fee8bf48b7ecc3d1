"""GET /openapi.json describes exactly the routes the app serves, and its schemas are valid."""

from __future__ import annotations

import re
from typing import Any

from jsonschema import Draft202012Validator

from gmlx_server.config import SAMPLING_KNOBS
from gmlx_server.errors import InvalidRequest
from gmlx_server.protocol.openapi_doc import document
from gmlx_server.protocol.params import sampling
from tests.hostile.harness import ROUTES
from tests.routes.conftest import serve

METHODS = {"get", "post", "put", "patch", "delete", "head", "options"}


def _openapi_path(route: str) -> str:
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", route)  # falcon's {model_id:path} is OpenAPI's {model_id}


def test_the_document_lists_every_route_and_nothing_else() -> None:
    doc = document("test")
    described = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops if m in METHODS}
    served = {(m, _openapi_path(p)) for m, p in ROUTES}
    assert described == served


def test_it_is_served() -> None:
    r = serve().client.get("/openapi.json")
    assert r.status_code == 200
    body = r.json()
    assert body["openapi"] == "3.1.0" and body["paths"] == document(body["info"]["version"])["paths"]


def _refs(value: Any) -> list[str]:
    stack: list[Any] = [value]
    out: list[str] = []
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            out.extend(v[k] for k in v if k == "$ref")
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return out


def test_every_schema_is_valid_and_every_ref_resolves() -> None:
    doc = document("test")
    schemas = doc["components"]["schemas"]
    for schema in schemas.values():
        Draft202012Validator.check_schema(schema)
    assert {r.rsplit("/", 1)[1] for r in _refs(doc)} <= set(schemas)


def _parses(name: str, v: object) -> bool:
    try:
        sampling({name: v})
    except InvalidRequest as e:
        assert e.param == name
        return False
    return True


def test_sampling_ranges_are_the_parsers() -> None:
    """At each knob's ends and one step past them, the document accepts exactly what the parser does."""
    chat = document("test")["components"]["schemas"]["ChatRequest"]["properties"]
    for name, knob in SAMPLING_KNOBS.items():
        step = 1 if knob.kind == "integer" else 0.5
        ends = (knob.lo - step, knob.lo, knob.hi, knob.hi + step)
        edges = (True, 1) if knob.kind == "boolean" else tuple(int(v) if step == 1 else v for v in ends)
        for v in edges:
            assert Draft202012Validator(chat[name]).is_valid(v) == _parses(name, v), (name, v)
