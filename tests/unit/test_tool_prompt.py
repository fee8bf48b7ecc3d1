"""gmlx's tool prompt: which syntax a request gets under each tool_format, the system block it renders with
the real SmolLM2 and Gemma 3 templates, earlier calls and results as text, and the parser's failure count."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gmlx_server.config import ConfigError, load_config, read_env
from gmlx_server.engine.chat_template import CHATML_TEMPLATE, GEMMA_TEMPLATE, JinjaChatTemplate
from gmlx_server.generation_params import GenerationParams
from gmlx_server.protocol.tools import FORMATS
from gmlx_server.serving.addressing import Settings
from gmlx_server.serving.generation import render_messages
from gmlx_server.serving.roles import call_text
from gmlx_server.serving.tool_prompt import ToolPlan, compact_tool, plan_tools, prompted_messages, tool_block
from tests.unit.test_tool_parsers import DATA, TOOLS

SMOLLM2 = json.loads((DATA / "tool_outputs" / "smollm2_hermes_captured.json").read_text())  # its real tools
CHATML = JinjaChatTemplate(CHATML_TEMPLATE, "family:chatml")  # Hermes syntax of its own
GEMMA = JinjaChatTemplate(GEMMA_TEMPLATE, "family:gemma")  # no syntax, no system role
ASK = ({"role": "user", "content": "Weather in Paris?"},)


def smollm2_template() -> JinjaChatTemplate:
    from gmlx_plan.gguf_header import read_header
    from tests.conftest import smollm2_path

    return JinjaChatTemplate(read_header(smollm2_path()).metadata["tokenizer.chat_template"], "gguf")


@pytest.mark.parametrize(("setting", "template", "expected"), [
    ("auto", GEMMA, ("json", "json")), ("json", GEMMA, ("json", "json")), ("template", GEMMA, None),
    ("auto", CHATML, ("hermes", "template")), ("template", CHATML, ("hermes", "template")),
    ("json", CHATML, ("json", "json")),
])
def test_tool_format_chooses_the_syntax(setting: Any, template: JinjaChatTemplate, expected: Any) -> None:
    plan = plan_tools(GenerationParams(messages=ASK, tools=tuple(TOOLS)), template, setting)
    assert (None if plan is None else (plan.syntax.name, plan.source)) == expected


def test_no_plan_without_tools_with_choice_none_or_a_raw_prompt() -> None:
    for inp in (GenerationParams(messages=ASK), GenerationParams(messages=ASK, tools=tuple(TOOLS), tool_choice="none"),
                GenerationParams(prompt="hi", tools=tuple(TOOLS))):
        assert plan_tools(inp, GEMMA, "json") is None


def test_the_block_describes_every_function_and_the_choice() -> None:
    auto = tool_block(TOOLS, None)
    for tool in TOOLS:
        fn = tool["function"]
        assert json.dumps({"name": fn["name"], "parameters": fn["parameters"]}) in auto
    assert "<tool_call>\n" in auto and "\n</tool_call>" in auto and "plain text" in auto
    assert "must call one of these" in tool_block(TOOLS, "required")
    named = tool_block(TOOLS, {"type": "function", "function": {"name": "get_time"}})
    assert 'must call the function "get_time"' in named and "plain text" not in named


def test_smollm2_renders_its_tools_in_the_system_turn() -> None:
    tools = SMOLLM2["tools"]
    inp = GenerationParams(messages=ASK, tools=tuple(tools))
    plan = ToolPlan(FORMATS["json"].syntax, "json")
    text, repaired = render_messages(inp, Settings({}), smollm2_template(), plan)
    assert repaired is None
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\n# Tools")  # its default system prompt is replaced by ours
    assert f'"name": "{tools[0]["function"]["name"]}"' in system and tools[0]["function"]["description"] in system
    assert text.endswith("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")
    own, _ = render_messages(inp, Settings({}), smollm2_template())  # without gmlx's prompt: nothing of the tools
    assert '"name"' not in own


def test_a_profile_system_prompt_comes_first_and_gemma_folds_it_into_the_user_turn() -> None:
    inp = GenerationParams(messages=ASK, tools=tuple(TOOLS), tool_choice="required")
    text, _ = render_messages(inp, Settings({}, system="Be brief."), GEMMA, ToolPlan(FORMATS["json"].syntax, "json"))
    assert text.startswith("<start_of_turn>user\nBe brief.\n\n# Tools\n")  # (no bos_token without a GGUF)
    assert "must call one of these functions now.\n\nWeather in Paris?<end_of_turn>" in text


def test_history_calls_and_results_become_text_that_gemma_accepts() -> None:
    msgs = [*ASK, {"role": "assistant", "content": "Checking.", "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "1", "content": [{"type": "text", "text": "18 C"}]},
            {"role": "user", "content": "And tomorrow?"}]
    out = prompted_messages(msgs, TOOLS, "auto")
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "user"]
    assert out[2]["content"] == 'Checking.\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' \
                               "\n</tool_call>"
    assert out[3]["content"] == "<tool_response>\n18 C\n</tool_response>"
    inp = GenerationParams(messages=tuple(msgs), tools=tuple(TOOLS))
    text, repaired = render_messages(inp, Settings({}), GEMMA, ToolPlan(FORMATS["json"].syntax, "json"))
    assert repaired is not None and "merged" in repaired  # two user turns in a row: the repair merges them
    assert "<start_of_turn>model\nChecking.\n\n<tool_call>" in text
    assert "18 C\n</tool_response>\n\nAnd tomorrow?" in text


def test_a_call_written_back_parses_as_the_call() -> None:
    for args in ({"city": "Köln"}, {}, '{"city": "Oslo"}'):
        text = call_text({"function": {"name": "get_weather", "arguments": args}})
        _, calls = FORMATS["json"].parse_text(text)
        assert [(c.name, c.arguments) for c in calls] == [
            ("get_weather", json.loads(args) if isinstance(args, str) else args)]


def test_the_parser_counts_calls_that_fail_to_parse() -> None:
    parser = FORMATS["json"].streaming()
    parser.feed('<tool_call>{"name": "a", "arguments": {}}</tool_call> <tool_call>{"name": </tool_call>')
    parser.feed("<tool_call>[]</tool_call> and <tool_call>{")
    parser.finish()
    assert (parser.calls, parser.failed) == (1, 3)
    bare = FORMATS["llama3_json"].streaming()  # a JSON reply that is not a call is no failed call
    bare.feed('{"answer": 42}')
    bare.finish()
    assert (bare.calls, bare.failed) == (0, 0)


def test_tool_format_is_checked_by_name_and_reload_changes_it(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    cfg = tmp_path / "gmlx.yaml"
    cfg.write_text(f"models:\n  m:\n    path: {model}\n    tool_format: json\n")
    entry = load_config(str(cfg)).models["m"]
    assert entry.tool_format == "json"
    assert entry.load_key == replace(entry, tool_format="auto").load_key  # a reload keeps the loaded engine
    cfg.write_text(f"models:\n  m:\n    path: {model}\n    tool_format: xml\n")
    with pytest.raises(ConfigError, match=r"models\.m\.tool_format: expected auto, template, json, got 'xml'"):
        load_config(str(cfg))
    assert read_env({}).log_format == "text" and read_env({"GMLX_LOG_FORMAT": "JSON"}).log_format == "json"
    with pytest.raises(ConfigError, match="GMLX_LOG_FORMAT"):
        read_env({"GMLX_LOG_FORMAT": "xml"})


def test_compact_tool_keeps_names_types_required_and_the_first_sentence() -> None:
    tool = {"type": "function", "function": {
        "name": "Bash", "description": "Runs a command. It has many rules:\n- never do X\n- always do Y",
        "parameters": {"type": "object", "required": ["command"], "additionalProperties": False, "properties": {
            "command": {"type": "string", "description": "The command to run, with a long explanation."},
            "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
            "options": {"type": "object", "properties": {"deep": {"type": "boolean"}}}}}}}
    assert compact_tool(tool) == {"type": "function", "function": {
        "name": "Bash", "description": "Runs a command.",
        "parameters": {"type": "object", "required": ["command"], "properties": {
            "command": {"type": "string"}, "mode": {"type": "string", "enum": ["a", "b"]},
            "options": {"type": "object"}}}}}
