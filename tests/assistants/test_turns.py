"""Reading one model turn: what streams to the client, and which calls it makes (Hermes-tagged, or a bare JSON
object naming an offered tool, as Qwen2.5-Coder writes them)."""

from __future__ import annotations

import pytest

from gmlx_server.assistants.turns import TurnReader
from gmlx_server.engine.tool_syntax import HERMES, ToolUse

TOOLS = [{"type": "function", "function": {"name": "lookup_capital", "parameters": {"type": "object"}}}]


def read(pieces: list[str]) -> tuple[list[str], TurnReader]:
    reader = TurnReader(ToolUse(HERMES, "template"), TOOLS)
    shown = [reader.feed(p) for p in pieces] + [reader.finish()]
    return [s for s in shown if s], reader


def test_a_tagged_call_is_read_and_its_markup_never_shown() -> None:
    shown, reader = read(["Let me look.", " <tool", "_call>\n", '{"name": "lookup_capital", ',
                          '"arguments": {"country": "Peru"}}', "\n</tool_call>"])
    assert shown == ["Let me look."] and [(c.name, dict(c.arguments)) for c in reader.calls] == [
        ("lookup_capital", {"country": "Peru"})]
    assert reader.assistant_message()["tool_calls"][0]["function"]["arguments"] == {"country": "Peru"}


@pytest.mark.parametrize("pieces", [
    ['{"name": "lookup_capital", ', '"arguments": {"country": "Peru"}}'],
    ["```", "json\n", '{"name": "lookup_capital", "arguments": {"country": "Peru"}}', "\n```"],
])
def test_a_bare_json_call_to_an_offered_tool_is_a_call(pieces: list[str]) -> None:
    shown, reader = read(pieces)
    assert shown == [] and [c.name for c in reader.calls] == ["lookup_capital"]
    assert reader.calls[0].call_id.startswith("call_")


@pytest.mark.parametrize("pieces", [
    ['{"name": "Bob", ', '"arguments": {}}'],  # not an offered tool: an answer that happens to be JSON
    ['{"country": "Peru"}'],
])
def test_json_that_is_no_call_is_shown_at_the_end(pieces: list[str]) -> None:
    shown, reader = read(pieces)
    assert shown == ["".join(pieces)] and not reader.calls and reader.shown == ["".join(pieces)]


def test_other_text_streams_as_it_comes() -> None:
    shown, _ = read(["```", "python\n", "print(1)", "\n```"])
    assert shown[0] == "```python" and "".join(shown) == "```python\nprint(1)\n```"
    shown, _ = read(["Paris", " is the capital."])
    assert shown == ["Paris", " is the capital."]
