"""Calls written without the template's markers: bare JSON, a fenced json block, marker slips."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gmlx_server.engine.types import TokenEvent
from gmlx_server.protocol.anthropic_out import AnthropicEncoder, MessageMeta
from gmlx_server.protocol.openai_out import OpenAIEncoder, ResponseMeta
from gmlx_server.protocol.tools import FORMATS, LenientCalls, TextDelta, ToolCallArgsDelta, ToolCallEnd, ToolCallStart

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
PARIS = ("get_weather", {"city": "Paris"})
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
CASES: list[tuple[str, str, str, list[tuple[str, dict[str, Any]]]]] = [
    # (format, reply, shown text, calls)
    ("hermes", '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```', "",
     [PARIS]),  # Qwen2.5-Coder 0.5B's greedy answer to "Weather in Paris?"
    ("hermes", f"\n{CALL}\n", "", [PARIS]),
    ("json", f'[{CALL}, {{"name": "get_time", "parameters": {{}}}}]', "", [PARIS, ("get_time", {})]),
    ("hermes", f'{CALL}\n{{"name": "get_time", "arguments": {{}}}}', "", [PARIS, ("get_time", {})]),  # JSON lines
    ("hermes", f'{CALL}\n{{"temperature_c": 22}}', f'{CALL}\n{{"temperature_c": 22}}', []),  # a call, then not
    ("hermes", f"<Tool_Call>\n{CALL}\n< /tool_call >", "", [PARIS]),
    ("hermes", f"Sure. <tool_call >{CALL}</tool_call>", "Sure.", [PARIS]),
    ("hermes", '{"name": "get_forecast", "arguments": {"city": "Paris"}}',
     '{"name": "get_forecast", "arguments": {"city": "Paris"}}', []),  # not an offered tool
    ("hermes", '{"answer": 42}', '{"answer": 42}', []),
    ("hermes", f"{CALL} is how you would call it.", f"{CALL} is how you would call it.", []),
    ("hermes", "```python\nprint(1)\n```", "```python\nprint(1)\n```", []),
    ("hermes", "I can't open <tools> or <tool_result> blocks here.",
     "I can't open <tools> or <tool_result> blocks here.", []),
    ("hermes", CALL[:-8], CALL[:-8], []),  # cut short: text, as it was written
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
]


def _run(fmt: str, pieces: list[str]) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    counter = itertools.count()
    parser = LenientCalls(FORMATS[fmt], TOOLS, lambda: f"id{next(counter)}")
    events = [e for p in pieces for e in parser.feed(p)] + parser.finish()
    names = {e.index: e.name for e in events if isinstance(e, ToolCallStart)}
    calls = [(names[e.index], e.arguments) for e in events if isinstance(e, ToolCallEnd)]
    assert parser.calls == len(calls)
    return "".join(e.text for e in events if isinstance(e, TextDelta)), calls


@pytest.mark.parametrize(("fmt", "reply", "text", "calls"), CASES)
def test_whole_reply(fmt: str, reply: str, text: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
    assert _run(fmt, [reply]) == (text, calls)


@given(st.sampled_from(CASES), st.lists(st.integers(0, 90), max_size=10))
def test_any_chunking_reads_the_same(case: tuple[str, str, str, list[Any]], cuts: list[int]) -> None:
    fmt, reply, text, calls = case
    at = sorted({min(c, len(reply)) for c in cuts})
    assert _run(fmt, [reply[a:b] for a, b in zip([0, *at], [*at, len(reply)], strict=True)]) == (text, calls)


def test_text_is_not_held_back() -> None:
    parser = LenientCalls(FORMATS["hermes"], TOOLS, lambda: "x")
    assert parser.feed("Hello") == [TextDelta("Hello")]
    assert parser.feed(", the weather <to") == [TextDelta(", the weather")]  # a marker may be starting
    assert parser.feed("day> is fine") == [TextDelta(" <today> is fine")]


def _constrained(pieces: list[str]) -> list[Any]:
    parser = LenientCalls(FORMATS["json"], TOOLS, lambda: "c1", constrained=True)
    return [e for p in pieces for e in parser.feed(p)] + parser.finish()


def test_a_constrained_call_streams_its_arguments_as_written() -> None:
    args = '{"city": "Paris", "note": "a}\\"b"}'  # a brace and a quote inside a string
    reply = f'Checking.<tool_call>\n{{"name": "get_weather", "arguments": {args}}}\n</tool_call>'
    events = _constrained(list(reply))  # one character at a time
    kinds = [type(e).__name__ for e in events]
    start, end = kinds.index("ToolCallStart"), kinds.index("ToolCallEnd")
    deltas = [e.json_fragment for e in events[start:end] if isinstance(e, ToolCallArgsDelta)]
    assert len(deltas) > 20 and json.loads("".join(deltas)) == {"city": "Paris", "note": 'a}"b'}
    assert "".join(deltas) == args and events[end].arguments == json.loads(args)
    assert events[start] == ToolCallStart(0, "c1", "get_weather")
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Checking."


def test_a_constrained_call_cut_short_ends_with_what_it_had() -> None:
    events = _constrained(['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'])
    assert [type(e).__name__ for e in events] == ["ToolCallStart", "ToolCallArgsDelta", "ToolCallEnd"]
    assert events[1].json_fragment == '{"city": "Pa' and events[2].arguments == {}


def test_a_call_cut_by_max_tokens_ends_by_length() -> None:
    for args, chat, anthropic in (('{"city": "Pa', "length", "max_tokens"), ('{"city": "Paris"}', "tool_calls",
                                                                             "tool_use")):
        oai = OpenAIEncoder(ResponseMeta("id", "m", 0, 3), tokenizer=None)  # type: ignore[arg-type]
        msg = AnthropicEncoder(MessageMeta("id", "m", 3))
        for enc in (oai, msg):
            enc.tool_start("c1", "get_weather")
            enc.tool_arguments(args)
            enc.tool_end()
            enc.feed(TokenEvent("", None, finish_reason="length"))
        assert (oai.finish_reason, msg.stop_reason) == (chat, anthropic)
