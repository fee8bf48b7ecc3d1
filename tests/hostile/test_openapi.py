"""GET /openapi.json describes exactly the routes the app serves, and its schemas are valid."""

from __future__ import annotations

import re
from typing import Any

from jsonschema import Draft202012Validator

from gmlx_server.protocol.openapi_doc import document
from gmlx_server.protocol.params import SAMPLING_FIELDS
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


def test_sampling_ranges_are_the_parsers() -> None:
    chat = document("test")["components"]["schemas"]["ChatRequest"]["properties"]
    for name, (kind, lo, hi) in SAMPLING_FIELDS.items():
        if kind != "boolean":
            assert chat[name]["maximum"] == hi and chat[name].get("minimum", chat[name].get("exclusiveMinimum")) == lo
