"""Structured-output fields: the protocol's shape checks (no llguidance) and the service's compile (llguidance)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gmlx_server.errors import InvalidRequest
from gmlx_server.generation_params import OutputFormat
from gmlx_server.protocol.anthropic import parse_messages
from gmlx_server.protocol.openai import parse_chat
from gmlx_server.protocol.output_fields import format_object
from gmlx_server.protocol.responses import parse_responses
from gmlx_server.serving.output_format import compile_format

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
HI = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> OutputFormat | None:
    return parse_chat({"messages": HI, **fields}).output_format


def refused(body: dict[str, Any]) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as err:
        parse_chat({"messages": HI, **body})
    return err.value


def compiled(fmt: OutputFormat | None) -> Any:
    return asyncio.run(compile_format(fmt))


# The protocol's shape checks --------------------------------------------------------------------------

def test_each_spelling_becomes_its_format() -> None:
    assert chat(response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}}) == OutputFormat(
        "json_schema", "response_format", "response_format.json_schema.schema", schema=SCHEMA)
    assert chat(response_format={"type": "json_object"}) == OutputFormat(
        "json_object", "response_format", "response_format", schema={"type": "object"})
    assert chat(response_format={"type": "json_schema", "json_schema": {"schema": True}}).schema == {}  # type: ignore[union-attr]
    assert chat(response_format={"type": "text"}) is None and chat() is None
    native = parse_messages({"messages": HI, "max_tokens": 5,
                             "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}).output_format
    assert native is not None and native.param == "output_config.format.schema"
    text = parse_responses({"input": "hi", "text": {"format": {"type": "json_schema", "schema": SCHEMA}}})
    assert text.params.output_format is not None and text.params.output_format.param == "text.format.schema"


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": []}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema.schema"),
])
def test_bad_shapes_are_a_400_naming_the_field(body: dict[str, Any], param: str) -> None:
    assert refused(body).param == param


def test_a_schema_too_deep_is_refused_before_any_compile() -> None:
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(70):
        deep = {"type": "array", "items": deep}
    err = refused({"response_format": {"type": "json_schema", "json_schema": {"schema": deep}}})
    assert (err.param, err.code) == ("response_format", "json_too_deep")


# The service's compile ----------------------------------------------------------------------------------

def test_formats_that_compile() -> None:
    grammar = compiled(chat(response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}}))
    assert (grammar.kind, grammar.schema) == ("json_schema", SCHEMA) and grammar.grammar
    assert compiled(chat(response_format={"type": "json_object"})).kind == "json_object"
    assert compiled(None) is None


@pytest.mark.parametrize("schema", [
    {"type": "strin"},
    {"type": "object", "properties": 5},
    {"type": "integer", "minimum": "a"},
    {"type": "integer", "minimum": 5, "maximum": 1},
    {"type": "string", "pattern": "(("},
    {"$ref": "#/definitions/missing"},
    {"allOf": [{"type": "string"}, {"type": "integer"}]},
])
def test_malformed_formats_are_a_400_before_generation(schema: Any) -> None:
    parsed = format_object({"type": "json_schema", "json_schema": {"schema": schema}}, "response_format")
    with pytest.raises(InvalidRequest) as err:
        compiled(parsed)
    assert parsed is not None and err.value.param == parsed.param and parsed.param in err.value.message
