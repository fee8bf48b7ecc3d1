"""Structured-output fields: the protocol's shape checks (no llguidance), the service's compile (llguidance, real),
and what each compiled grammar lets random logits write."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import jsonschema
import pytest

from gmlx_server.engine.structured import GrammarConstraint, GrammarTokenizerCache
from gmlx_server.errors import InvalidRequest
from gmlx_server.generation_params import OutputFormat
from gmlx_server.protocol.anthropic import parse_messages
from gmlx_server.protocol.openai import parse_chat, parse_completion
from gmlx_server.protocol.output_fields import MAX_GRAMMAR_CHARS, format_object
from gmlx_server.protocol.responses import parse_responses
from gmlx_server.serving.output_format import compile_format
from tests.unit.test_structured import FakeVocab, _decode

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
HI = [{"role": "user", "content": "hi"}]
LARK = 'start: "yes" | "no" | NUM\nNUM: /[0-9]{1,3}/'
GBNF = 'root ::= item ("," item)?\nitem ::= [a-c]+'


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
    assert chat(response_format={"type": "regex", "regex": "[0-9]+"}) == OutputFormat(
        "regex", "response_format", "response_format.regex", pattern="[0-9]+")
    assert chat(response_format={"type": "choice", "choice": ["a", "b"]}) == OutputFormat(
        "choice", "response_format", "response_format.choice", choices=("a", "b"))
    assert chat(structured_outputs={"grammar": LARK}) == OutputFormat(
        "grammar", "structured_outputs", "structured_outputs.grammar", grammar=LARK)
    assert chat(structured_outputs={"json": json.dumps(SCHEMA)}) == OutputFormat(
        "json_schema", "structured_outputs", "structured_outputs.json", schema=SCHEMA)
    assert chat(structured_outputs={"json_object": True, "regex": None}).kind == "json_object"  # type: ignore[union-attr]
    assert chat(grammar=GBNF) == OutputFormat("grammar", "grammar", "grammar", grammar=GBNF)
    assert chat(grammar="") is None and chat(response_format={"type": "text"}) is None


def test_every_generation_route_reads_the_aliases() -> None:
    so = {"structured_outputs": {"regex": "a+"}}
    assert parse_messages({"messages": HI, "max_tokens": 5, **so}).output_format is not None
    assert parse_responses({"input": "hi", **so}).params.output_format is not None
    assert parse_completion({"prompt": "x", "grammar": GBNF}).output_format is not None
    native = parse_messages({"messages": HI, "max_tokens": 5,
                             "output_config": {"format": {"type": "choice", "choice": ["x"]}}}).output_format
    assert native is not None and native.param == "output_config.format.choice"
    text = parse_responses({"input": "hi", "text": {"format": {"type": "json_schema", "schema": SCHEMA}}})
    assert text.params.output_format is not None and text.params.output_format.param == "text.format.schema"


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "regex"}}, "response_format.regex"),
    ({"response_format": {"type": "regex", "regex": 5}}, "response_format.regex"),
    ({"response_format": {"type": "choice", "choice": []}}, "response_format.choice"),
    ({"response_format": {"type": "choice", "choice": ["a", 1]}}, "response_format.choice"),
    ({"response_format": {"type": "grammar", "grammar": "x" * (MAX_GRAMMAR_CHARS + 1)}}, "response_format.grammar"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": []}}},
     "response_format.json_schema.schema"),
    ({"structured_outputs": "a+"}, "structured_outputs"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
    ({"structured_outputs": {"json_object": 1}}, "structured_outputs.json_object"),
    ({"grammar": ["root ::= x"]}, "grammar"),
])
def test_bad_shapes_are_a_400_naming_the_field(body: dict[str, Any], param: str) -> None:
    assert refused(body).param == param


def test_two_formats_at_once_name_both() -> None:
    err = refused({"response_format": {"type": "json_object"}, "grammar": GBNF})
    assert err.param == "grammar" and "'response_format'" in err.message
    err = refused({"structured_outputs": {"regex": "a"}, "grammar": GBNF})
    assert err.param == "grammar" and "'structured_outputs'" in err.message


def test_a_schema_too_deep_is_refused_before_any_compile() -> None:
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(70):
        deep = {"type": "array", "items": deep}
    err = refused({"structured_outputs": {"json": deep}})
    assert (err.param, err.code) == ("structured_outputs.json", "json_too_deep")


# The service's compile ----------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", [
    {"type": "regex", "regex": "[a-z"},
    {"type": "regex", "regex": "(a"},
    {"type": "grammar", "grammar": "start: foo"},
    {"type": "grammar", "grammar": "start: ("},
    {"type": "grammar", "grammar": 'root ::= "yes'},
    {"type": "grammar", "grammar": "root ::= missing"},
    {"type": "json_schema", "json_schema": {"schema": {"type": "strin"}}},
    {"type": "json_schema", "json_schema": {"schema": {"type": "integer", "minimum": 5, "maximum": 1}}},
    {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/definitions/missing"}}},
    {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": 5}}},
    {"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "(("}}},
    {"type": "json_schema", "json_schema": {"schema": {"allOf": [{"type": "string"}, {"type": "integer"}]}}},
])
def test_malformed_formats_are_a_400_before_generation(fmt: dict[str, Any]) -> None:
    parsed = format_object(fmt, "response_format")
    with pytest.raises(InvalidRequest) as err:
        compiled(parsed)
    assert parsed is not None and err.value.param == parsed.param and parsed.param in err.value.message


def test_formats_that_compile() -> None:
    grammar = compiled(chat(response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}}))
    assert (grammar.kind, grammar.schema) == ("json_schema", SCHEMA) and grammar.grammar
    assert compiled(chat(response_format={"type": "json_object"})).kind == "json_object"
    assert compiled(chat(grammar=GBNF)).kind == "grammar" and compiled(None) is None


# What the grammars let a sampler write --------------------------------------------------------------------

def _outputs(fmt: OutputFormat | None, seeds: range = range(6)) -> list[str]:
    vocab = FakeVocab()
    grammar = compiled(fmt)
    tokenizer = GrammarTokenizerCache().get(vocab, vocab.padded)
    return [_decode(GrammarConstraint(grammar, tokenizer), vocab, seed, seed % 2 == 1).decode() for seed in seeds]


def test_regex_output_matches_in_full() -> None:
    pattern = "[A-Z][a-z]{2,5}-[0-9]{2}"
    for text in _outputs(chat(response_format={"type": "regex", "regex": pattern})):
        assert re.fullmatch(pattern, text), text


def test_choice_output_is_one_of_the_choices() -> None:
    choices = ["red", "green", "blue é"]
    outputs = _outputs(chat(structured_outputs={"choice": choices}))
    assert set(outputs) <= set(choices)


def test_lark_and_gbnf_outputs_parse() -> None:
    assert all(re.fullmatch("yes|no|[0-9]{1,3}", t) for t in _outputs(chat(response_format={
        "type": "grammar", "grammar": LARK})))
    assert all(re.fullmatch("[a-c]+(,[a-c]+)?", t) for t in _outputs(chat(grammar=GBNF)))


def test_structured_outputs_json_holds_to_its_schema() -> None:
    for text in _outputs(chat(structured_outputs={"json": SCHEMA})):
        jsonschema.validate(json.loads(text), SCHEMA)
