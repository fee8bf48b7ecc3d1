"""Tool calls end to end over the fake engine: a template with a call syntax makes the reply's calls
OpenAI tool_calls, Anthropic tool_use blocks and Responses function_call items, streamed or not, each
checked with that SDK's own accumulator."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from tests.fakes import HERMES_TEXT, FakeBehavior, FakeFactory
from tests.routes import test_messages as anthropic_route
from tests.routes import test_responses as responses_route
from tests.routes.conftest import Served, serve, sse_events

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}]  # type: ignore[index]
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "parameters": ANTHROPIC_TOOLS[0]["input_schema"]}]
# A call cut mid-marker and mid-JSON, as tokens arrive, after some text.
CALL = ["Let me check.", " <tool", "_call>", '{"name": "get_weather", ', '"arguments": {"city": "Pa', 'ris"}}',
        "</tool_call>"]


Make = Callable[..., Served]
Hermes = Callable[[list[str]], Served]


@pytest.fixture
def make() -> Iterator[Make]:
    """serve() over a FakeFactory built from the keywords; every client is closed afterwards."""
    made: list[Served] = []

    def build(**factory: Any) -> Served:
        made.append(serve(factory=FakeFactory(**factory)))
        return made[-1]

    yield build
    for s in made:
        s.client.close()


@pytest.fixture
def hermes(make: Make) -> Hermes:
    """An app whose model's template speaks Hermes <tool_call>, generating `pieces`."""
    return lambda pieces: make(behavior=FakeBehavior(pieces=pieces), template_text=HERMES_TEXT)


def openai_final(events: list[Any]) -> Any:
    """The openai SDK's own accumulation of the streamed chunks."""
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for data in events:
        if isinstance(data, dict) and data.get("choices"):
            state.handle_chunk(ChatCompletionChunk.model_validate(data))
    return state.get_final_completion()


# --- OpenAI chat ----------------------------------------------------------------------------------

def test_chat_returns_tool_calls_with_finish_reason_tool_calls(hermes: Hermes) -> None:
    s = hermes(CALL)
    choice = s.chat({"tools": TOOLS}).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert choice["message"]["content"] == "Let me check."


def test_chat_stream_deltas_accumulate_in_the_sdk(hermes: Hermes) -> None:
    s = hermes(CALL)
    r = s.chat({"tools": TOOLS, "stream": True})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    deltas = [e["choices"][0]["delta"] for e in events[:-1]]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["index"] == 0 and calls[0]["id"].startswith("call_")
    assert calls[0]["function"]["name"] == "get_weather"
    assert "<tool" not in "".join(d.get("content", "") for d in deltas)
    assert [e["choices"][0]["finish_reason"] for e in events[:-1]][-1] == "tool_calls"
    final = openai_final(events).choices[0]
    assert final.finish_reason == "tool_calls" and final.message.content == "Let me check."
    assert final.message.tool_calls[0].function.name == "get_weather"
    assert json.loads(final.message.tool_calls[0].function.arguments) == {"city": "Paris"}


def test_two_calls_get_two_indexes(hermes: Hermes) -> None:
    one = '<tool_call>{"name": "get_weather", "arguments": {"city": "%s"}}</tool_call>'
    s = hermes([one % "Rome", "\n", one % "Oslo"])
    calls = s.chat({"tools": TOOLS}).json()["choices"][0]["message"]["tool_calls"]
    assert [json.loads(c["function"]["arguments"])["city"] for c in calls] == ["Rome", "Oslo"]
    final = openai_final(sse_events(s.chat({"tools": TOOLS, "stream": True}).text))
    assert [c.index for c in final.choices[0].message.tool_calls] == [0, 1]


def test_a_call_with_invalid_json_comes_back_as_text(hermes: Hermes) -> None:
    broken = ['<tool_call>{"name": "get_weather", ', '"arguments": {"city": }}</tool_call>']
    s = hermes(broken)
    choice = s.chat({"tools": TOOLS}).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == "".join(broken)


def test_without_tools_or_with_tool_choice_none_nothing_is_parsed(hermes: Hermes) -> None:
    s = hermes(CALL)
    assert s.chat().json()["choices"][0]["message"]["content"] == "".join(CALL)
    choice = s.chat({"tools": TOOLS, "tool_choice": "none"}).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == "".join(CALL)
    assert s.engine().template.calls[-1]["tools"] is None


def test_a_template_without_call_syntax_gets_gmlx_tool_prompt_and_its_calls(served: Served) -> None:
    served.factory.behavior.pieces = CALL
    choice = served.chat({"tools": TOOLS}).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Let me check."
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    sent = served.engine().template.calls[-1]
    assert sent["tools"] is None  # gmlx wrote them into the system prompt instead
    system = sent["messages"][0]
    assert system["role"] == "system" and '"name": "get_weather"' in system["content"]
    assert "<tool_call>" in system["content"] and "plain text" in system["content"]  # auto may answer in text


def test_tool_format_template_leaves_tools_to_a_template_without_syntax(template_tools: Served) -> None:
    template_tools.factory.behavior.pieces = CALL
    choice = template_tools.chat({"tools": TOOLS}).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == "".join(CALL)
    assert template_tools.engine().template.calls[-1]["tools"] == TOOLS  # offered to the template, as sent
    assert template_tools.engine().submitted[-1].grammar is None


def test_gmlx_tool_prompt_turns_history_calls_and_results_into_text(served: Served) -> None:
    msgs = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
                {"id": "2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
            {"role": "tool", "tool_call_id": "1", "content": "cold"},
            {"role": "tool", "tool_call_id": "2", "content": "warm"}]
    assert served.chat({"messages": msgs, "tools": TOOLS}).status_code == 200
    sent = served.engine().template.calls[-1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[2] == {"role": "assistant", "content": (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')}
    assert sent[3]["content"] == "<tool_response>\ncold\n</tool_response>\n<tool_response>\nwarm\n</tool_response>"


@pytest.mark.parametrize(("choice", "forced"), [
    ("auto", False), ("required", True), ({"type": "function", "function": {"name": "get_weather"}}, True)])
def test_every_choice_is_constrained_with_gmlx_json(served: Served, choice: Any, forced: bool) -> None:
    served.chat({"tools": TOOLS, "tool_choice": choice})
    grammar = served.engine().submitted[-1].grammar
    assert grammar is not None and grammar.kind == "tool_call"
    assert grammar.schema["anyOf"][0]["properties"]["name"] == {"const": "get_weather"}
    assert ("opened[lazy]" in grammar.grammar) != forced  # auto: text, or text that opens a call


def test_a_newline_stop_holds_the_call_to_one_line(served: Served) -> None:
    served.chat({"tools": TOOLS, "tool_choice": "required"})
    assert '"\\n"' in served.engine().submitted[-1].grammar.grammar  # Hermes' layout: the body on its own line
    served.chat({"tools": TOOLS, "tool_choice": "required", "stop": ["\n"]})
    assert '"\\n"' not in served.engine().submitted[-1].grammar.grammar  # else the stop would cut every call


def test_a_named_function_that_is_not_offered_is_a_400(served: Served, hermes: Hermes) -> None:
    named = {"type": "function", "function": {"name": "nope"}}
    for s in (served, hermes(CALL)):
        r = s.chat({"tools": TOOLS, "tool_choice": named})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
        assert "nope" in r.json()["error"]["message"]
    r = anthropic_route.post(served, {"tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "tool", "name": "nope"}})
    assert r.status_code == 400 and r.json()["type"] == "error"


def test_response_format_wins_over_the_call_grammar(served: Served) -> None:
    served.chat({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}})
    grammar = served.engine().submitted[-1].grammar
    assert grammar is not None and grammar.kind == "json_object"


def test_tool_calls_are_counted_in_metrics(served: Served) -> None:
    served.factory.behavior.pieces = CALL
    served.chat({"tools": TOOLS, "tool_choice": "required"})
    served.factory.behavior.pieces = ['<tool_call>{"name": "get_weather", "arguments": {"city": }}</tool_call>']
    served.chat({"tools": TOOLS})
    section = served.client.get("/v1/metrics").json()["server"]["tool_calls"]
    assert (section["parsed"], section["constrained"], section["failed"]) == (1, 1, 1)
    assert section["by_model"] == {"m1": {"parsed": 1, "constrained": 1, "failed": 1}}
    prom = served.client.get("/v1/metrics?format=prometheus").text
    assert 'gmlx_tool_calls_total{model="m1",outcome="failed"} 1.0' in prom
    assert 'gmlx_tool_calls_total{model="m1",outcome="constrained"} 1.0' in prom


def test_format_stop_strings_join_the_request_only_with_tools(make: Make) -> None:
    s = make(template_text="<start_function_call>")  # FunctionGemma's syntax
    s.chat({"tools": TOOLS, "stop": ["END"]})
    assert s.engine().submitted[-1].stop == ("END", "<start_function_response>")
    s.chat({"tools": TOOLS, "tool_choice": "none"})
    assert s.engine().submitted[-1].stop == ()


def test_forced_call_reaches_the_template_and_warns_when_none_comes(hermes: Hermes,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    s = hermes(["No call."])
    s.chat()  # loads the engine, whose template then reads tool_choice
    s.engine().template.variables = frozenset({"tool_choice"})
    named = {"type": "function", "function": {"name": "get_weather"}}
    with caplog.at_level(logging.WARNING, logger="gmlx.tools"):
        body = s.chat({"tools": TOOLS, "tool_choice": named}).json()
    assert s.engine().template.calls[-1]["variables"]["tool_choice"] == named
    assert body["choices"][0]["finish_reason"] == "stop"
    assert any("produced none" in r.message for r in caplog.records)
    caplog.clear()
    s.factory.behavior.pieces = CALL
    with caplog.at_level(logging.WARNING, logger="gmlx.tools"):
        assert s.chat({"tools": TOOLS, "tool_choice": "required"}).json()["choices"][0]["finish_reason"] == "tool_calls"
    assert s.engine().template.calls[-1]["variables"]["tool_choice"] == "required"
    assert not caplog.records


# --- Anthropic Messages ---------------------------------------------------------------------------

def test_messages_answer_with_tool_use_blocks(hermes: Hermes) -> None:
    s = hermes(CALL)
    body = anthropic_route.post(s, {"tools": ANTHROPIC_TOOLS}).json()
    assert body["stop_reason"] == "tool_use"
    text, call = body["content"]
    assert text == {"type": "text", "text": "Let me check."}
    assert call["type"] == "tool_use" and call["id"].startswith("toolu_") and call["input"] == {"city": "Paris"}


def test_messages_stream_tool_use_with_input_json_delta(hermes: Hermes) -> None:
    s = hermes(CALL)
    events = anthropic_route.stream(s, {"tools": ANTHROPIC_TOOLS})
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert [b["type"] for b in starts] == ["text", "tool_use"] and starts[1]["name"] == "get_weather"
    partial = [d["delta"]["partial_json"] for n, d in events if n == "content_block_delta"
               and d["delta"]["type"] == "input_json_delta"]
    assert json.loads("".join(partial)) == {"city": "Paris"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use" and events[-1][0] == "message_stop"
    snapshot = None
    for _, data in events:  # the SDK's own accumulator
        snapshot = accumulate_event(event=data, current_snapshot=snapshot, json_bufs={})
    assert snapshot is not None and snapshot.stop_reason == "tool_use"
    assert snapshot.content[1].input == {"city": "Paris"}  # type: ignore[union-attr]


def test_messages_tool_choice_any_is_required(hermes: Hermes) -> None:
    s = hermes(CALL)
    s.chat()  # loads the engine
    s.engine().template.variables = frozenset({"tool_choice"})
    anthropic_route.post(s, {"tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "any"}})
    assert s.engine().template.calls[-1]["variables"]["tool_choice"] == "required"


# --- OpenAI Responses -----------------------------------------------------------------------------

def test_responses_answer_with_function_call_items(hermes: Hermes) -> None:
    s = hermes(CALL)
    out = responses_route.post(s, {"tools": RESPONSES_TOOLS}).json()["output"]
    assert [o["type"] for o in out] == ["message", "function_call"]
    assert out[1]["call_id"].startswith("call_") and json.loads(out[1]["arguments"]) == {"city": "Paris"}
    events = responses_route.stream(s, {"tools": RESPONSES_TOOLS})
    names = [n for n, _ in events]
    assert "response.function_call_arguments.delta" in names and names[-1] == "response.completed"
    done = next(d for n, d in events if n == "response.function_call_arguments.done")
    assert json.loads(done["arguments"]) == {"city": "Paris"}
    final = responses_route.sdk_final(events)
    assert final.output[1].name == "get_weather" and final.output[0].content[0].text == "Let me check."


def test_responses_continue_after_a_call_with_its_output(hermes: Hermes) -> None:
    s = hermes(CALL)
    first = responses_route.post(s, {"tools": RESPONSES_TOOLS}).json()
    call_id = first["output"][1]["call_id"]
    s.factory.behavior.pieces = ["Sunny."]
    follow = {"previous_response_id": first["id"], "tools": RESPONSES_TOOLS,
              "input": [{"type": "function_call_output", "call_id": call_id, "output": "22 C"}]}
    assert responses_route.post(s, follow).json()["output"][0]["content"][0]["text"] == "Sunny."
    sent = responses_route.template_messages(s)
    assert sent[-2]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert sent[-1] == {"role": "tool", "tool_call_id": call_id, "content": "22 C", "name": "get_weather"}
