"""Each tool-call syntax, property-tested: random calls rendered as the model's turn by the real template that
teaches the syntax (tests/data/templates), then read back by that syntax's parser, come back equal.

The history a template renders is the form the model learns to write, so a call the parser cannot read back
from it is a call the parser would miss in a reply.
"""

from __future__ import annotations

import keyword
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gmlx_server.engine.chat_template import JinjaChatTemplate
from gmlx_server.engine.tool_syntax import GMLX_JSON, infer_tool_syntax
from gmlx_server.protocol.tools import FORMATS, format_of
from gmlx_server.serving.roles import call_text

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "templates"
# template file -> the syntax it teaches (asserted, so a change in inference shows here first)
# (qwen3_coder.jinja, gemma3_tool_code.jinja and gemma4.jinja are snippets that render no calls or no arguments:
# their forms are written below.)
SYNTAX_OF = {"qwen2.5.jinja": "hermes", "qwen3.jinja": "hermes", "llama3.1.jinja": "llama3_json",
             "mistral_v3.jinja": "mistral", "mistral_tekken.jinja": "mistral", "functiongemma.jinja": "functiongemma"}
NAMES = st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True).filter(lambda n: not keyword.iskeyword(n))  # tool_code
WORDS = st.text(st.characters(codec="ascii", categories=("L", "N"), include_characters=" .,-"), min_size=1,
                max_size=20).map(str.strip).filter(lambda w: w and w.lower() != "null")
# "null" in any case is JSON's null in the Qwen3-Coder XML form (as vLLM's and mlx-vlm's parsers read it), not text
VALUES = st.one_of(WORDS, st.integers(-1000, 1000))
ARGS = st.dictionaries(st.from_regex(r"[a-z][a-z_]{0,7}", fullmatch=True).filter(lambda n: not keyword.iskeyword(n)),
                       VALUES, max_size=3)
CALLS = st.lists(st.tuples(NAMES, ARGS), min_size=1, max_size=2, unique_by=lambda c: c[0])


def _tools(calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The offered tools, their parameters typed as the call's values are (the XML syntax reads types here)."""
    def kind(v: Any) -> str:
        return "integer" if isinstance(v, int) else "string"

    return [{"type": "function", "function": {"name": name, "description": "a tool", "parameters": {
        "type": "object", "properties": {k: {"type": kind(v)} for k, v in args.items()}}}} for name, args in calls]


def _turn(template: JinjaChatTemplate, calls: list[tuple[str, dict[str, Any]]]) -> str:
    """What the template writes for an assistant turn of these calls: the rendering past the generation prompt."""
    tools = _tools(calls)
    ask = [{"role": "user", "content": "Do it."}]
    turn = {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"call{i:07d}", "type": "function", "function": {"name": n, "arguments": a}}
        for i, (n, a) in enumerate(calls)]}
    head = template.render(ask, tools=tools, add_generation_prompt=True)
    whole = template.render([*ask, turn, {"role": "user", "content": "Thanks."}], tools=tools,
                            add_generation_prompt=False)
    if whole.startswith(head):
        return whole[len(head):]
    syntax = infer_tool_syntax(template.text)  # a template that lays out history otherwise: from the first call
    assert syntax is not None
    return whole[whole.index(syntax.starts[0], whole.index("Do it.")):]


@pytest.mark.parametrize("name", sorted(SYNTAX_OF))
@settings(max_examples=25, deadline=None)
@given(calls=CALLS)
def test_template_rendered_calls_parse_back_equal(name: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
    template = JinjaChatTemplate((TEMPLATES / name).read_text(encoding="utf-8"), "test")
    syntax = infer_tool_syntax(template.text)
    assert syntax is not None and syntax.name == SYNTAX_OF[name]
    if syntax.name == "llama3_json":
        calls = calls[:1]  # Llama 3.1's template renders one call per turn
    _, parsed = format_of(syntax).parse_text(_turn(template, calls), _tools(calls))
    assert [(c.name, c.arguments) for c in parsed] == calls


def _qwen3_coder(name: str, args: dict[str, Any]) -> str:
    """Qwen3-Coder's template: <tool_call><function=NAME><parameter=P>value</parameter>...</function></tool_call>."""
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def _tool_code(name: str, args: dict[str, Any]) -> str:
    """Gemma 3's prompted style: a Python call in a tool_code fence."""
    return f"```tool_code\n{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})\n```"


def _gemma4(name: str, args: dict[str, Any]) -> str:
    """Gemma 4: <|tool_call>call:NAME{key:<|"|>text<|"|>,key:5}<tool_call|>."""
    body = ",".join(f"{k}:{v}" if isinstance(v, int) else f'{k}:<|"|>{v}<|"|>' for k, v in args.items())
    return f"<|tool_call>call:{name}{{{body}}}<tool_call|>"


@pytest.mark.parametrize(("syntax", "render"), [("qwen3_coder", _qwen3_coder), ("gemma_tool_code", _tool_code),
                                                ("gemma4", _gemma4)])
@settings(max_examples=40, deadline=None)
@given(calls=CALLS)
def test_written_calls_parse_back_equal(syntax: str, render: Any, calls: list[tuple[str, dict[str, Any]]]) -> None:
    text = "\n".join(render(n, a) for n, a in calls)
    _, parsed = FORMATS[syntax].parse_text(text, _tools(calls))
    assert [(c.name, c.arguments) for c in parsed] == calls


@settings(max_examples=60, deadline=None)
@given(calls=CALLS)
def test_gmlx_json_convention_parses_back_equal(calls: list[tuple[str, dict[str, Any]]]) -> None:
    """gmlx's own convention: earlier calls are written back as text in the form its prompt teaches."""
    text = "\n".join(call_text({"function": {"name": n, "arguments": a}}) for n, a in calls)
    _, parsed = format_of(GMLX_JSON).parse_text(text, _tools(calls))
    assert [(c.name, c.arguments) for c in parsed] == calls
