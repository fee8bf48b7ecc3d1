"""Tool calling on models whose templates define no call syntax (SmolLM2, Gemma 3 270M), through the official
SDKs against one real `gmlx serve` (at DEBUG, so the request log carries each rendered prompt).

tool_choice required / a named function: every answer is one structured call whose arguments validate against
the tool's schema, over several prompts and seeds; auto: calls that validate, or text, never a broken call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.conftest import gemma_path, smollm2_path
from tests.e2e.server import ROOT, LiveServer, anthropic_client, gmlx_serve, openai_client

pytestmark = pytest.mark.slow
# Bounded values (an enum, small integers, strings of at most 24 characters): every call fits in MAX_TOKENS.
WEATHER = {"type": "object", "required": ["city"], "properties": {
    "city": {"type": "string", "maxLength": 24}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}
ADD = {"type": "object", "required": ["a", "b"], "properties": {
    "a": {"type": "integer", "minimum": -1000, "maximum": 1000}, "b": {"type": "integer", "minimum": -1000,
                                                                      "maximum": 1000}}}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather now in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": ADD}}]
CLAUDE_TOOLS: list[Any] = [{"name": t["function"]["name"], "description": t["function"]["description"],
                            "input_schema": t["function"]["parameters"]} for t in TOOLS]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
PROMPTS = [("What is the weather in Paris?", 1), ("What is 2 plus 3?", 2), ("Tell me a joke.", 3)]
MAX_TOKENS = 80


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("tools")
    config = tmp / "gmlx.yaml"
    config.write_text(f"models:\n  smollm2:\n    path: {smollm2_path()}\n  gemma:\n    path: {gemma_path()}\n")
    with gmlx_serve(["--config", str(config), "--log-level", "debug"], tmp) as s:
        yield s


@pytest.fixture(scope="module")
def oai(server: LiveServer) -> openai.OpenAI:
    return openai_client(server, 600)


@pytest.fixture(scope="module")
def claude(server: LiveServer) -> anthropic.Anthropic:
    return anthropic_client(server, 600)


def _valid(name: str, arguments: Any, only: str | None = None) -> None:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    assert name in SCHEMAS and (only is None or name == only)
    jsonschema.validate(args, SCHEMAS[name])


def request_line(server: LiveServer, rid: str) -> dict[str, Any]:
    """The request log's fields for one response id (values JSON-decoded where quoted)."""
    line = next(ln for ln in server.log().splitlines() if f"gmlx.request: request id={rid} " in ln)
    return {k: json.loads(v) if v.startswith('"') else v
            for k, v in re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', line.split("gmlx.request: ", 1)[1])}


@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_openai_required_and_named_always_give_a_valid_call(oai: openai.OpenAI, server: LiveServer,
                                                           model: str) -> None:
    prompts = PROMPTS if model == "smollm2" else PROMPTS[:2]
    for (prompt, seed), choice in zip(prompts * 2, ["required"] * len(prompts) + ["add"] * len(prompts),
                                      strict=True):
        tool_choice: Any = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
        r = oai.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}], tools=TOOLS,
                                        tool_choice=tool_choice, max_tokens=MAX_TOKENS, seed=seed, temperature=0.8)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and not c.message.content, (prompt, c)
        [call] = c.message.tool_calls or []
        _valid(call.function.name, call.function.arguments, None if choice == "required" else choice)
    line = request_line(server, r.id)
    assert (line["model"], line["status"], line["finish"], line["tool_calls"]) == (model, "200", "tool_calls", "1")
    assert int(line["generated_tokens"]) <= MAX_TOKENS and float(line["duration_s"]) > 0


@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_anthropic_any_and_named_tool_stream_and_not(claude: anthropic.Anthropic, model: str) -> None:
    for (prompt, seed), choice, stream in ((PROMPTS[0], {"type": "any"}, False),
                                           (PROMPTS[1], {"type": "tool", "name": "get_weather"}, True)):
        body: dict[str, Any] = {"model": model, "max_tokens": MAX_TOKENS, "tools": CLAUDE_TOOLS,
                                "tool_choice": choice, "messages": [{"role": "user", "content": prompt}],
                                "extra_body": {"seed": seed, "temperature": 0.8}}
        pieces: list[str] = []
        if stream:
            with claude.messages.stream(**body) as s:
                pieces = [e.delta.partial_json for e in s if e.type == "content_block_delta"
                          and e.delta.type == "input_json_delta"]
                msg = s.get_final_message()
        else:
            msg = claude.messages.create(**body)
        assert msg.stop_reason == "tool_use", msg
        [block] = [b for b in msg.content if b.type == "tool_use"]
        assert block.id.startswith("toolu_")
        _valid(block.name, block.input, choice.get("name"))
        if stream:  # gmlx's JSON convention under a call grammar: the arguments stream as they are written
            assert len(pieces) >= 2 and json.loads("".join(pieces)) == block.input, pieces


def test_responses_required_call_streamed(oai: openai.OpenAI) -> None:
    tools: Any = [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"],
                   "strict": None} for t in TOOLS]
    with oai.responses.stream(model="smollm2", input="Add 19 and 23.", tools=tools, tool_choice="required",
                              max_output_tokens=MAX_TOKENS, temperature=0.8, extra_body={"seed": 4}) as stream:
        final = stream.get_final_response()
    [call] = [o for o in final.output if o.type == "function_call"]
    _valid(call.name, call.arguments)


@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_auto_answers_with_valid_calls_or_text_never_a_broken_call(oai: openai.OpenAI, server: LiveServer,
                                                                  model: str) -> None:
    before = httpx.get(server.v1 + "/metrics").json()["server"]["tool_calls"]["by_model"].get(model, {})
    cut_calls = 0
    for prompt, seed in PROMPTS if model == "smollm2" else PROMPTS[:2]:
        r = oai.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}], tools=TOOLS,
                                        max_tokens=MAX_TOKENS, seed=seed, temperature=0.8)
        c = r.choices[0]
        for call in c.message.tool_calls or []:
            _valid(call.function.name, call.function.arguments)
        opened = "<tool_call>" in (c.message.content or "")
        assert not opened or c.finish_reason == "length", c  # only max_tokens can leave a call unfinished
        cut_calls += opened
    after = httpx.get(server.v1 + "/metrics").json()["server"]["tool_calls"]["by_model"][model]
    assert after.get("failed", 0) - before.get("failed", 0) == cut_calls


def test_pi_tools_reach_smollm2_prompt(server: LiveServer) -> None:
    """pi's first request (its 4 tools, its system prompt) as captured; the request log at DEBUG shows the
    prompt the model saw."""
    pi = json.loads((ROOT / "tests/data/agents/pi-session.json").read_text())["requests"][0]["body"]
    body = {**pi, "model": "smollm2", "stream": False, "max_completion_tokens": 8}
    body.pop("stream_options", None)
    r = httpx.post(server.v1 + "/chat/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    prompt = request_line(server, r.json()["id"])["prompt"]
    system = prompt.split("<|im_end|>")[0]
    for tool in pi["tools"]:
        fn = tool["function"]
        assert f'"name": "{fn["name"]}"' in system and json.dumps(fn["description"])[:60] in system
    assert "<tool_call>" in system and pi["messages"][0]["content"][:60] in system
