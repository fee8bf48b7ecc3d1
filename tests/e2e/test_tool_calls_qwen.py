"""Tool calls on the project's own tool-capable model (Qwen2.5-Coder 0.5B, Hermes template) through the
official SDKs, against a real `gmlx serve`: calls written without the template's markers, parallel_tool_calls,
and a constrained call's arguments streamed as they are written.

Asked "Weather in Paris?" with one get_weather tool, the 0.5B model answers greedily with a fenced json
block of the call, not `<tool_call>` tags. That reply is a call (finish_reason tool_calls), streamed and not;
the tool's result sent back gets a final text answer. What that answer says is the 0.5B model's: it restates
its call and the result it was given.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.conftest import qwen_coder_path
from tests.e2e.server import LiveServer, anthropic_client, gmlx_serve

pytestmark = pytest.mark.slow
MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m"  # the file's stem: served alone
TOOLS: list[Any] = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}}]
ASK: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
RESULT = json.dumps({"temperature_c": 22, "sky": "sunny"})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with gmlx_serve([qwen_coder_path("0.5b")], tmp_path_factory.mktemp("markerless")) as s:
        yield s


def _ask(oai: openai.OpenAI, messages: list[Any], stream: bool) -> tuple[str | None, str, list[dict[str, Any]]]:
    """(finish_reason, content, tool calls) of one greedy turn, read the way a harness reads it."""
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "tools": TOOLS, "max_tokens": 60,
                            "temperature": 0}
    if not stream:
        choice = oai.chat.completions.create(**body).choices[0]
        calls = [c.model_dump() for c in choice.message.tool_calls or ()]
        return choice.finish_reason, choice.message.content or "", calls
    content, calls, finish = "", {}, None
    for chunk in oai.chat.completions.create(**body, stream=True):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for d in choice.delta.tool_calls or ():
            call = calls.setdefault(d.index, {"id": d.id, "type": "function",
                                              "function": {"name": "", "arguments": ""}})
            call["function"]["name"] += d.function.name or ""
            call["function"]["arguments"] += d.function.arguments or ""
        finish = choice.finish_reason or finish
    return finish, content, list(calls.values())


@pytest.mark.parametrize("stream", [False, True])
def test_get_weather_round_trip(oai: openai.OpenAI, stream: bool) -> None:
    finish, content, calls = _ask(oai, ASK, stream)
    assert finish == "tool_calls" and content == ""
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})]
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": calls},
               {"role": "tool", "tool_call_id": calls[0]["id"], "content": RESULT}]
    finish, answer, calls = _ask(oai, history, stream)
    assert finish == "stop" and not calls
    assert "22" in answer and "sunny" in answer  # the tool's result reached the answer


TWO_TOOLS: list[Any] = [*TOOLS, {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}}]
SEVERAL = "You can call several functions in one reply, each in its own <tool_call></tool_call> block."
BOTH: list[Any] = [{"role": "system", "content": SEVERAL},
                   {"role": "user", "content": "What's the weather and the local time in Paris?"}]


def test_parallel_tool_calls_false_gives_one_call(oai: openai.OpenAI, server: LiveServer) -> None:
    """Greedy, the model writes two calls (as JSON lines); parallel_tool_calls false keeps the first."""
    body: dict[str, Any] = {"model": MODEL, "messages": BOTH, "tools": TWO_TOOLS, "max_tokens": 150,
                            "temperature": 0}
    names = [[c.function.name for c in oai.chat.completions.create(**body, **extra).choices[0].message.tool_calls]
             for extra in ({}, {"parallel_tool_calls": False})]
    assert names == [["get_weather", "get_time"], ["get_weather"]]
    streamed = [(d.index, d.function.name) for chunk in oai.chat.completions.create(**body, stream=True)
                for d in chunk.choices[0].delta.tool_calls or () if d.function.name]
    assert streamed == [(0, "get_weather"), (1, "get_time")]  # each call its own index
    tools = [{"type": "function", **t["function"]} for t in TWO_TOOLS]
    for flag, expected in ((True, ["get_weather", "get_time"]), (False, ["get_weather"])):
        r = oai.responses.create(model=MODEL, input=BOTH, tools=tools, max_output_tokens=150, temperature=0,
                                 parallel_tool_calls=flag)
        assert r.parallel_tool_calls is flag and [o.name for o in r.output if o.type == "function_call"] == expected
    claude = anthropic_client(server)
    for one, expected in ((False, ["get_weather", "get_time"]), (True, ["get_weather"])):
        msg = claude.messages.create(
            model=MODEL, max_tokens=150, system=SEVERAL, messages=BOTH[1:], extra_body={"temperature": 0},
            tools=[{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TWO_TOOLS],
            tool_choice={"type": "auto", "disable_parallel_tool_use": one})
        assert [b.name for b in msg.content if b.type == "tool_use"] == expected
    assert "parallel_tool_calls false: 1 more call(s) after the first dropped" in server.log()


WRITE: list[Any] = [{"type": "function", "function": {
    "name": "write_file", "description": "Write a file",
    "parameters": {"type": "object", "required": ["path", "content"],
                   "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}}}]
SCRIPT: list[Any] = [{"role": "user", "content": "Write count.py: a Python script that prints the numbers 1 to 20, "
                                                 "each with its square."}]


def test_a_long_constrained_call_streams_its_arguments(oai: openai.OpenAI, server: LiveServer) -> None:
    """tool_choice required holds the reply to a call grammar: its arguments arrive token by token. Each chunk
    says how many tokens were generated so far (timings_per_token), so the first argument bytes are measured
    to arrive many tokens before the call ends."""
    at: list[int] = []  # generated tokens when each argument delta arrived
    arguments, finish, deltas = "", None, []
    for chunk in oai.chat.completions.create(model=MODEL, messages=SCRIPT, tools=WRITE, tool_choice="required",
                                             max_tokens=200, temperature=0, stream=True,
                                             extra_body={"timings_per_token": True}):
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for d in choice.delta.tool_calls or ():
            deltas.append(d)
            if d.function.arguments:
                arguments += d.function.arguments
                at.append(chunk.model_extra["timings"]["predicted_n"])
    assert finish == "tool_calls" and set(json.loads(arguments)) == {"path", "content"}
    assert len(at) >= 20 and at[-1] - at[0] >= 20, at  # the first piece came 20+ tokens before the last
    first, rest = deltas[0], deltas[1:]  # the first delta names the call; the rest carry argument pieces only
    assert first.id and first.function.name == "write_file" and not first.function.arguments
    assert all(d.index == 0 and not d.id and not d.function.name for d in rest)
    claude = anthropic_client(server)
    tool = {"name": "write_file", "input_schema": WRITE[0]["function"]["parameters"]}
    with claude.messages.stream(model=MODEL, max_tokens=200, messages=SCRIPT, tools=[tool],  # type: ignore[list-item]
                                tool_choice={"type": "any"}, extra_body={"temperature": 0}) as s:
        pieces = [e.delta.partial_json for e in s if e.type == "content_block_delta"
                  and e.delta.type == "input_json_delta"]
    assert len(pieces) >= 20 and json.loads("".join(pieces)) == json.loads(arguments)
    events = oai.responses.create(model=MODEL, input=SCRIPT, tools=[{"type": "function", **WRITE[0]["function"]}],
                                  tool_choice="required", max_output_tokens=200, temperature=0, stream=True)
    seen = list(events)
    pieces = [e.delta for e in seen if e.type == "response.function_call_arguments.delta"]
    assert len(pieces) >= 20 and json.loads("".join(pieces)) == json.loads(arguments)
    done = next(e.response for e in seen if e.type == "response.completed")
    assert done.parallel_tool_calls is False  # asked true by default; the call grammar holds one call
