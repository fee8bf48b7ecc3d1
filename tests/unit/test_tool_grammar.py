"""The call grammar over the real SmolLM2 and Gemma 3 vocabularies: what it accepts and refuses, and random
walks through it (any token the mask allows, at every step) that always end in one call the parser reads and
whose arguments validate against the tool's schema."""

from __future__ import annotations

import json
import logging
from typing import Any

import jsonschema
import llguidance as llg
import llguidance.numpy as llg_numpy
import numpy as np
import pytest

from gmlx_plan.gguf_header import read_header
from gmlx_server.engine.structured import StructuredOutputError, build_llg_tokenizer
from gmlx_server.engine.tokenizer import GGUFTokenizer
from gmlx_server.engine.tool_grammar import closed, compile_tool_grammar
from gmlx_server.engine.tool_syntax import GMLX_JSON, LLAMA3_JSON, QWEN3_CODER, ToolSyntax
from gmlx_server.protocol.tools import FORMATS, LenientCalls, ToolCallEnd, ToolCallStart
from gmlx_server.serving.tool_choice import special_markers
from tests.conftest import gemma_path, smollm2_path

# Bounded values, so that a random walk ends: enums, small integers, short strings, one nested object.
WEATHER = {"type": "object", "required": ["city"], "properties": {
    "city": {"type": "string", "maxLength": 6}, "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
ALARM = {"type": "object", "required": ["at"], "properties": {
    "at": {"type": "object", "required": ["hour"], "properties": {
        "hour": {"type": "integer", "minimum": 0, "maximum": 23}, "pm": {"type": "boolean"}}},
    "tags": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 3}}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "set_alarm", "parameters": ALARM}},
         {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


class Vocab:
    def __init__(self, path: str) -> None:
        self.tokenizer = GGUFTokenizer.from_metadata(read_header(path).metadata)
        self.llg = build_llg_tokenizer(self.tokenizer)

    def matcher(self, grammar: str) -> llg.LLMatcher:
        return llg.LLMatcher(self.llg, grammar, log_level=0)

    def accepts(self, grammar: str, text: str) -> tuple[bool, bool]:
        """(every token of `text` accepted, the grammar is complete after it)."""
        m = self.matcher(grammar)
        ok = all(m.consume_token(t) for t in self.tokenizer.encode(text, False))
        return ok, ok and m.is_accepting()


@pytest.fixture(scope="module", params=["smollm2", "gemma"])
def vocab(request: pytest.FixtureRequest) -> Vocab:
    return Vocab(smollm2_path() if request.param == "smollm2" else gemma_path())


def grammar(choice: str | None, syntax: ToolSyntax = GMLX_JSON, special: dict[str, int] | None = None) -> str:
    return compile_tool_grammar(syntax, TOOLS, choice, special).grammar


def test_auto_takes_text_or_text_and_one_valid_call(vocab: Vocab) -> None:
    g = grammar("auto")
    assert vocab.accepts(g, "It is sunny in Paris, <b>really</b> {not a call}.") == (True, True)
    assert vocab.accepts(g, CALL) == (True, True) and vocab.accepts(g, "Let me see.\n" + CALL) == (True, True)
    for bad in ('<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',  # city is required
                '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>',
                '<tool_call>\nget_weather(city="Paris")',
                '<tool_call>\n{"name": "now", "arguments": {"x": 1}}\n</tool_call>',  # closed: no invented keys
                CALL + " and then some text"):  # one call ends the reply
        assert not vocab.accepts(g, bad)[0], bad


MARKERLESS = ['{"name": "get_weather", "arguments": {"city": "Paris"}}',  # bare JSON of the call shape
              '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',  # a fenced block
              '<Tool_Call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n< /tool_call >']  # slips


@pytest.mark.parametrize("reply", MARKERLESS)
def test_auto_lets_calls_without_markers_through_to_the_reader(vocab: Vocab, reply: str) -> None:
    """The auto grammar takes a call written without the markers as text, and the lenient reader makes it a call."""
    assert vocab.accepts(grammar("auto"), reply) == (True, True)
    parser = LenientCalls(FORMATS["json"], TOOLS, lambda: "id0")
    events = [*parser.feed(reply), *parser.finish()]
    names = [e.name for e in events if isinstance(e, ToolCallStart)]
    arguments = [e.arguments for e in events if isinstance(e, ToolCallEnd)]
    assert names == ["get_weather"] and arguments == [{"city": "Paris"}]


def test_required_and_named_allow_nothing_but_the_call(vocab: Vocab) -> None:
    required, named = grammar("required"), grammar("set_alarm")
    assert vocab.accepts(required, CALL) == (True, True)
    assert not vocab.accepts(required, "Sure. " + CALL)[0] and not vocab.accepts(required, "No.")[0]
    assert not vocab.accepts(named, CALL)[0]
    alarm = '<tool_call>\n{"name": "set_alarm", "arguments": {"at": {"hour": 7}}}\n</tool_call>'
    assert vocab.accepts(named, alarm) == (True, True)
    assert not vocab.accepts(named, alarm.replace("7", "25"))[0]  # the schema's maximum holds


def _walk(vocab: Vocab, g: str, rng: np.random.Generator, prefix: str = "", steps: int = 300) -> str:
    """Random allowed tokens from `prefix` until the grammar ends it (or EOS is drawn)."""
    m = vocab.matcher(g)
    ids = vocab.tokenizer.encode(prefix, False)
    assert all(m.consume_token(t) for t in ids)
    mask = llg_numpy.allocate_token_bitmask(1, vocab.llg.vocab_size)
    eos = vocab.tokenizer.eos_ids
    for _ in range(steps):
        if m.is_stopped():
            return vocab.tokenizer.decode(ids)
        llg_numpy.fill_next_token_bitmask(m, mask, 0)
        allowed = np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little")[: vocab.tokenizer.vocab_size])
        token = int(rng.choice(allowed))
        if token in eos:
            return vocab.tokenizer.decode(ids)
        assert m.consume_token(token), m.get_error()
        ids.append(token)
    raise AssertionError(f"no end after {steps} tokens: {vocab.tokenizer.decode(ids)!r}")


@pytest.mark.parametrize("choice", ["required", "set_alarm", "auto"])
def test_every_random_walk_ends_in_one_call_that_validates(vocab: Vocab, choice: str) -> None:
    g, rng = grammar(choice), np.random.default_rng(7)
    for _ in range(12):
        text = _walk(vocab, g, rng, prefix="Let me check. <tool_call>" if choice == "auto" else "")
        shown, calls = FORMATS["json"].parse_text(text)
        assert len(calls) == 1, text
        assert choice in ("required", "auto", calls[0].name)
        jsonschema.validate(calls[0].arguments, SCHEMAS[calls[0].name])
        assert shown == ("Let me check." if choice == "auto" else "")


def test_llama3_calls_are_bare_json_with_parameters(vocab: Vocab) -> None:
    auto = grammar("auto", LLAMA3_JSON)
    assert vocab.accepts(auto, '{"name": "now", "parameters": {}}') == (True, True)
    assert vocab.accepts(auto, "Plain text.") == (True, True)
    assert not vocab.accepts(auto, '{"answer": 42}')[0]  # a reply that opens with '{' is a call
    assert not vocab.accepts(grammar("required", LLAMA3_JSON), "Plain text.")[0]


def test_a_marker_that_is_a_special_token_is_named_by_id() -> None:
    gemma = Vocab(gemma_path())
    marker = "<unused0>"  # a control token of Gemma's vocabulary
    syntax = ToolSyntax("test", (marker,), "</tool_call>", args_key="arguments", newlines=True)
    special = special_markers(syntax, gemma.tokenizer)
    assert list(special) == [marker]
    g = grammar("required", syntax, special)
    body = '\n{"name": "now", "arguments": {}}\n</tool_call>'
    m = gemma.matcher(g)
    assert m.consume_token(special[marker])
    assert all(m.consume_token(t) for t in gemma.tokenizer.encode(body, False)) and m.is_accepting()
    spelled = gemma.tokenizer.encode("<", False) + gemma.tokenizer.encode("unused0>", False)
    assert not gemma.matcher(g).consume_token(spelled[0])  # spelled out as text, it is not the marker


def test_schemas_are_closed_where_they_list_properties() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {}}},
                                               "c": {"type": "array", "items": {"properties": {"d": {}}}}},
              "anyOf": [{"properties": {"e": {}}}], "allOf": [{"properties": {"f": {}}}]}
    out = closed(schema)
    assert out["additionalProperties"] is False and out["properties"]["a"]["additionalProperties"] is False
    assert out["properties"]["c"]["items"]["additionalProperties"] is False
    assert out["anyOf"][0]["additionalProperties"] is False and "additionalProperties" not in out["allOf"][0]
    assert closed({"properties": {}, "additionalProperties": True})["additionalProperties"] is True
    assert "additionalProperties" not in schema  # the input is untouched


def test_an_unenforceable_schema_keeps_only_an_object_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    bad = {"type": "function", "function": {"name": "broken", "parameters": {"$ref": "#/$defs/missing"}}}
    with caplog.at_level(logging.WARNING, logger="gmlx.tools"):
        compiled = compile_tool_grammar(GMLX_JSON, [*TOOLS, bad], "auto")
    assert any("'broken'" in r.message and "cannot be enforced" in r.message for r in caplog.records)
    options: list[dict[str, Any]] = compiled.schema["anyOf"]
    assert options[-1]["properties"]["arguments"] == {"type": "object"}
    assert options[0]["properties"]["arguments"]["properties"]["city"] == WEATHER["properties"]["city"]


def test_what_cannot_be_constrained_is_refused() -> None:
    with pytest.raises(StructuredOutputError, match="no offered function"):
        compile_tool_grammar(GMLX_JSON, TOOLS, "nope")
    with pytest.raises(StructuredOutputError, match="cannot be constrained"):
        compile_tool_grammar(QWEN3_CODER, TOOLS, "required")
    assert json.loads(json.dumps(compile_tool_grammar(GMLX_JSON, TOOLS, "now").schema))["anyOf"][0][
        "properties"]["name"] == {"const": "now"}
