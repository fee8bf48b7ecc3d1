"""POST /v1/messages and /v1/messages/count_tokens over the fake engine: bodies, the exact event
sequence, every stop_reason, content blocks -> template messages, Anthropic-shaped errors."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gmlx_server.config import RuntimeEnv
from gmlx_server.engine.types import TokenEvent
from gmlx_server.protocol.anthropic_out import AnthropicEncoder, MessageMeta, signature
from gmlx_server.protocol.params import ignored_params
from gmlx_server.protocol.shared import ToolCall
from tests.fakes import FakeBehavior, FakeFactory, FakeTemplate
from tests.routes.conftest import Lines, Served, ThreadedServer, make_config, serve
from tests.routes.test_params import another_client, bodies, json_values

HI = [{"role": "user", "content": "hi"}]
GOLDEN = ["message_start", "content_block_start", "ping", *["content_block_delta"] * 4, "content_block_stop",
          "message_delta", "message_stop"]


def named_sse(text: str) -> list[tuple[str, Any]]:
    """(event name, data) for each SSE event; each data's `type` must repeat its event name."""
    out = []
    for block in text.split("\n\n"):
        lines = [ln for ln in block.splitlines() if not ln.startswith(":")]
        if not lines:
            continue
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        name, data = lines[0][len("event: "):], json.loads(lines[1][len("data: "):])
        assert data["type"] == name
        out.append((name, data))
    return out


def post(s: Served, body: dict[str, Any] | None = None, path: str = "/v1/messages", **kw: Any) -> Any:
    return s.client.post(path, json={"model": "m1", "max_tokens": 64, "messages": HI, **(body or {})}, **kw)


def stream(s: Served, body: dict[str, Any] | None = None) -> list[tuple[str, Any]]:
    r = post(s, {"stream": True, **(body or {})})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    return named_sse(r.text)


def text_of(events: list[tuple[str, Any]]) -> str:
    return "".join(d["delta"].get("text", "") for n, d in events if n == "content_block_delta")


def anthropic_error(r: Any, status: int, type_: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == type_ and body["error"]["message"]
    return dict(body["error"])


# --- bodies and streams ---------------------------------------------------------------------------

def test_non_streaming_message(served: Served) -> None:
    body = post(served).json()
    prompt = len(served.engine().submitted[0].prompt_tokens)
    assert body["id"].startswith("msg_") and body["type"] == "message" and body["role"] == "assistant"
    assert body["model"] == "m1" and body["content"] == [{"type": "text", "text": "Hello, world!"}]
    assert (body["stop_reason"], body["stop_sequence"]) == ("end_turn", None)
    assert body["usage"] == {"input_tokens": prompt, "output_tokens": 4, "cache_creation_input_tokens": 0,
                             "cache_read_input_tokens": 0}


def test_stream_golden_event_order(served: Served) -> None:
    events = stream(served)
    assert [n for n, _ in events] == GOLDEN
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    assert events[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for n, d in events if n == "content_block_delta")
    assert text_of(events) == "Hello, world!"
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 4 and delta["usage"]["input_tokens"] == start["usage"]["input_tokens"]


@pytest.mark.parametrize("body, reason, sequence, text", [
    ({}, "end_turn", None, "Hello, world!"),
    ({"max_tokens": 2}, "max_tokens", None, "Hello,"),
    ({"stop_sequences": ["wor", "zzz"]}, "stop_sequence", "wor", "Hello, "),
])
def test_every_stop_reason(served: Served, body: dict[str, Any], reason: str, sequence: str | None,
                           text: str) -> None:
    r = post(served, body).json()
    assert (r["stop_reason"], r["stop_sequence"], r["content"][0]["text"]) == (reason, sequence, text)
    events = stream(served, body)
    assert events[-2][1]["delta"] == {"stop_reason": reason, "stop_sequence": sequence}
    assert text_of(events) == text and events[-1][0] == "message_stop"


def test_tool_use_stop_reason_and_blocks_from_a_parsed_call() -> None:
    """A whole parsed call (tool_call) the Anthropic way; test_tools.py drives it from model text."""
    enc = AnthropicEncoder(MessageMeta("msg_1", "m1", 7))
    events = [*enc.start(), *enc.text("Let me check."), *enc.tool_call(ToolCall("get_weather", '{"city": "Paris"}')),
              *enc.feed(TokenEvent("", None, finish_reason="stop"))]
    assert [n for n, _ in events] == ["message_start", "content_block_start", "ping", "content_block_delta",
                                      "content_block_stop", "content_block_start", "content_block_delta",
                                      "content_block_stop", "message_delta", "message_stop"]
    assert events[6][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"city": "Paris"}'}
    snapshot = None
    for _, data in events:  # the SDK's own accumulator accepts the sequence
        snapshot = accumulate_event(event=data, current_snapshot=snapshot, json_bufs={})  # type: ignore[arg-type]
    assert snapshot is not None and snapshot.stop_reason == "tool_use"
    assert snapshot.content[1].input == {"city": "Paris"}  # type: ignore[union-attr]
    body = enc.body()
    assert body["stop_reason"] == "tool_use" and body["content"][1]["type"] == "tool_use"
    assert body["content"][1]["id"].startswith("toolu_") and body["content"][1]["input"] == {"city": "Paris"}


def test_a_streamed_call_from_the_parser_gets_prefixed_ids_and_fragments() -> None:
    enc = AnthropicEncoder(MessageMeta("msg_1", "m1", 7))
    events = [*enc.tool_start("abc", "f"), *enc.tool_arguments('{"a": '), *enc.tool_arguments("1}"),
              *enc.tool_end({"a": 1}), *enc.feed(TokenEvent("", None, finish_reason="stop"))]
    assert [d["delta"]["partial_json"] for n, d in events if n == "content_block_delta"] == ['{"a": ', "1}"]
    assert enc.body()["content"] == [{"type": "tool_use", "id": "toolu_abc", "name": "f", "input": {"a": 1}}]
    assert enc.body()["stop_reason"] == "tool_use"


def test_thinking_text_gets_its_own_block_first_and_is_signed() -> None:
    enc = AnthropicEncoder(MessageMeta("msg_1", "m1", 7, thinking=True))
    events = [*enc.start(), *enc.reasoning("hmm", 1), *enc.text("Paris")]
    assert [n for n, _ in events[:2]] == ["message_start", "ping"]  # no text block before the thinking
    kinds = [(n, d.get("content_block", d.get("delta", {})).get("type")) for n, d in events[2:]]
    assert kinds == [("content_block_start", "thinking"), ("content_block_delta", "thinking_delta"),
                     ("content_block_delta", "signature_delta"), ("content_block_stop", None),
                     ("content_block_start", "text"), ("content_block_delta", "text_delta")]
    sig = signature("hmm")
    assert events[4][1]["delta"]["signature"] == sig and len(sig) > 20
    assert enc.body()["content"] == [{"type": "thinking", "thinking": "hmm", "signature": sig},
                                     {"type": "text", "text": "Paris"}]


def test_a_reply_that_may_think_and_writes_nothing_still_has_a_text_block() -> None:
    enc = AnthropicEncoder(MessageMeta("msg_1", "m1", 7, thinking=True))
    events = [*enc.start(), *enc.feed(TokenEvent("", None, finish_reason="stop"))]
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert starts == [{"type": "text", "text": ""}]
    assert enc.body()["content"] == [{"type": "text", "text": ""}]


def test_empty_generation_still_has_a_text_block(served: Served) -> None:
    served.factory.behavior.pieces = []
    assert post(served).json()["content"] == [{"type": "text", "text": ""}]


def test_keepalive_comments_while_silent() -> None:
    s = serve(make_config(env=RuntimeEnv(sse_keepalive_s=0.02)), FakeFactory(FakeBehavior(prefill_s=0.2)))
    r = post(s, {"stream": True})
    assert r.text.count(": keepalive\n\n", 0, r.text.index("text_delta")) >= 3
    assert [n for n, _ in named_sse(r.text)] == GOLDEN


def test_client_disconnect_cancels_the_stream() -> None:
    s = serve(make_config(env=RuntimeEnv(sse_keepalive_s=0.05)),
              FakeFactory(FakeBehavior(pieces=["x"] * 1000, token_s=0.02)))
    body = {"model": "m1", "max_tokens": 1000, "messages": HI, "stream": True}
    with ThreadedServer(s.app) as url, httpx.Client(base_url=url) as c:
        with c.stream("POST", "/v1/messages", json=body) as r:
            next(r.iter_lines())
        deadline = time.monotonic() + 5
        while (not s.engine().handles[-1].cancelled or s.engine().running) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert s.engine().handles[-1].cancelled and not s.engine().running


def test_error_after_start_is_an_error_event() -> None:
    s = serve(factory=FakeFactory(FakeBehavior(fail_after=2)))
    events = stream(s)
    assert events[-1] == ("error", {"type": "error", "error": {"type": "api_error", "code": "engine_error",
                                                               "message": "generation failed: boom"}})
    assert "message_stop" not in [n for n, _ in events] and text_of(events) == "Hello,"
    s.factory.behavior.fail_after, s.factory.behavior.shed_after = None, 1
    err = stream(s)[-1][1]["error"]
    assert (err["type"], err["code"]) == ("overloaded_error", "server_overloaded_shed")


# --- requests -> template messages ----------------------------------------------------------------

def template_call(s: Served) -> dict[str, Any]:
    tpl: FakeTemplate = s.engine().template
    return tpl.calls[-1]


def test_system_and_blocks_become_template_messages(served: Served) -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
                                         {"type": "text", "text": "b"}]},
            {"role": "user", "content": "c"}]
    post(served, {"system": [{"type": "text", "text": "S1"}, {"type": "text", "text": "S2"}], "messages": msgs})
    assert template_call(served)["messages"] == [{"role": "system", "content": "S1\nS2"},
                                                 {"role": "user", "content": "a\nb\nc"}]  # same-role turns merge
    header = {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.123; cc_entrypoint=sdk-cli;"}
    post(served, {"system": [header, {"type": "text", "text": "S"}], "messages": msgs})
    assert template_call(served)["messages"][0] == {"role": "system", "content": "S"}  # Claude Code's header
    post(served, {"system": [header], "messages": msgs})
    assert template_call(served)["messages"][0]["role"] == "user"
    post(served, {"system": "plain"})
    assert template_call(served)["messages"][0] == {"role": "system", "content": "plain"}


def test_mid_conversation_system_messages_join_the_user_turn_beside_them(served: Served) -> None:
    # Claude Code's mid-conversation-system beta puts a system message after the first user turn.
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}, {"role": "system", "content": "R"},
            {"role": "assistant", "content": "yo"}, {"role": "system", "content": [{"type": "text", "text": "Q"}]},
            {"role": "user", "content": "next"}]
    post(served, {"system": "S", "messages": msgs})
    assert template_call(served)["messages"] == [
        {"role": "system", "content": "S"}, {"role": "user", "content": "hi\nR"},
        {"role": "assistant", "content": "yo"}, {"role": "user", "content": "Q\nnext"}]


@pytest.mark.parametrize("config, effort", [({"effort": "high"}, "high"), ({"effort": "max"}, "xhigh"),
                                            ({"effort": "ultra"}, None), ({}, None)])
def test_output_config_effort_is_the_reasoning_effort(served: Served, config: dict[str, Any],
                                                      effort: str | None) -> None:
    post(served, {"thinking": {"type": "adaptive"}, "output_config": config})
    assert template_call(served)["variables"].get("reasoning_effort") == effort


def test_tool_use_and_tool_result_render_as_transformers_expects(template_tools: Served) -> None:
    served = template_tools
    msgs = [{"role": "user", "content": "Weather in Paris and Rome?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "two calls", "signature": "x"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "t2", "name": "weather", "input": {"city": "Rome"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "rain"}],
                 "is_error": True},
                {"type": "text", "text": "Thanks"}]}]
    tools = [{"name": "weather", "description": "Weather now", "input_schema": {"type": "object"}},
             {"type": "web_search_20250305", "name": "web_search"}]
    assert post(served, {"messages": msgs, "tools": tools}).status_code == 200
    call = template_call(served)
    assert call["tools"] == [{"type": "function", "function": {"name": "weather", "description": "Weather now",
                                                               "parameters": {"type": "object"}}}]
    assert call["messages"][1:] == [
        {"role": "assistant", "content": "Checking.", "reasoning_content": "two calls", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}},
            {"id": "t2", "type": "function", "function": {"name": "weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "sunny", "name": "weather"},
        {"role": "tool", "tool_call_id": "t2", "content": "Error: rain", "name": "weather"},
        {"role": "user", "content": "Thanks"}]


@pytest.mark.parametrize("choice, tools_kept, variable", [
    ({"type": "auto"}, True, None),
    ({"type": "none"}, False, None),
    ({"type": "any"}, True, "required"),
    ({"type": "tool", "name": "f"}, True, {"type": "function", "function": {"name": "f"}}),
])
def test_tool_choice_maps_onto_the_request_values(template_tools: Served, choice: dict[str, Any], tools_kept: bool,
                                                  variable: Any) -> None:
    served = template_tools
    post(served)
    served.engine().template.variables = frozenset({"tool_choice"})
    tools = [{"name": "f", "input_schema": {"type": "object", "properties": {}}}]
    assert post(served, {"tools": tools, "tool_choice": choice}).status_code == 200
    call = template_call(served)
    assert (call["tools"] is not None) == tools_kept
    assert call["variables"].get("tool_choice") == variable


def test_sampling_stop_and_thinking_reach_the_engine(served: Served) -> None:
    post(served, {"temperature": 0.2, "top_p": 0.9, "top_k": 7, "seed": 3, "stop_sequences": ["END"],
                  "thinking": {"type": "enabled", "budget_tokens": 48}, "metadata": {"user_id": "u"},
                  "context_management": {"edits": []}, "service_tier": "auto", "output_config": {"effort": "low"}})
    req = served.engine().submitted[-1]
    sp = req.sampling
    assert (sp.temperature, sp.top_p, sp.top_k, sp.seed) == (0.2, 0.9, 7, 3)
    assert req.stop == ("END",) and req.max_tokens == 64 and req.thinking is not None
    assert req.thinking.budget == 48 and template_call(served)["variables"] == {"enable_thinking": True,
                                                                                "reasoning_effort": "low"}
    post(served, {"thinking": {"type": "disabled"}, "stop": ["ignored"]})
    assert template_call(served)["variables"] == {"enable_thinking": False}
    assert served.engine().submitted[-1].stop == ()


def test_max_tokens_is_optional(served: Served) -> None:
    served.client.post("/v1/messages", json={"model": "m1", "messages": HI})
    req = served.engine().submitted[-1]
    assert req.max_tokens == (4096 - len(req.prompt_tokens)) // 2  # the default cap: half of what the prompt leaves


# --- count_tokens ---------------------------------------------------------------------------------

def test_count_tokens_equals_reported_input_tokens(served: Served) -> None:
    body = {"system": "Be brief.", "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}]}
    count = post(served, body, "/v1/messages/count_tokens")
    assert count.status_code == 200 and set(count.json()) == {"input_tokens"}
    assert count.json()["input_tokens"] == post(served, body).json()["usage"]["input_tokens"]
    without_tools = post(served, {**body, "tools": None}, "/v1/messages/count_tokens").json()["input_tokens"]
    assert without_tools < count.json()["input_tokens"]  # the tools are part of the prompt
    assert len(served.engine().submitted) == 1  # counting submits nothing


# --- errors ---------------------------------------------------------------------------------------

def test_unknown_model_is_anthropic_not_found_with_the_model_list() -> None:
    s = serve(make_config(("a", "b")))
    err = anthropic_error(post(s, {"model": "claude-sonnet-4"}), 404, "not_found_error")
    assert "a, b" in err["message"] and err["available_models"] == ["a", "b"]
    anthropic_error(post(s, {"model": "nope"}, "/v1/messages/count_tokens"), 404, "not_found_error")


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "developer", "content": "x"}]}, "messages[0].role"),
    ({"output_config": {"effort": 3}}, "output_config.effort"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "1", "name": "f", "input": {}}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "1"}]}]},
     "messages[0].content[0]"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"stop_sequences": [1]}, "stop_sequences"),
    ({"stop_sequences": ["s"] * 65}, "stop_sequences"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"tools": [{"name": "f", "input_schema": []}]}, "tools[0].input_schema"),
    ({"thinking": {"type": "enabled", "budget_tokens": "lots"}}, "thinking.budget_tokens"),
])
def test_bad_bodies_are_invalid_request_errors(served: Served, body: dict[str, Any], param: str) -> None:
    err = anthropic_error(post(served, body), 400, "invalid_request_error")
    assert param in err["message"]


def test_unsupported_features_are_typed() -> None:
    s = serve()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    err = anthropic_error(post(s, {"messages": [{"role": "user", "content": [image]}]}), 400,
                          "invalid_request_error")
    assert err["code"] == "unsupported_feature" and "vision" in err["message"]
    bad_schema = {"format": {"type": "json_schema", "schema": {"type": "nope"}}}
    err = anthropic_error(post(s, {"output_config": bad_schema}), 400, "invalid_request_error")
    assert "output_config.format" in err["message"] and "malformed JSON schema" in err["message"]
    schema = {"format": {"type": "json_schema", "schema": {"type": "object"}}}
    assert post(s, {"output_config": schema}).status_code == 200
    grammar = s.engine().submitted[-1].grammar
    assert grammar is not None and grammar.schema == {"type": "object"}


def test_context_overflow_is_the_prompt_too_long_400() -> None:
    s = serve(factory=FakeFactory(context_length=64))
    err = anthropic_error(post(s, {"max_tokens": 60}), 400, "invalid_request_error")
    assert err["message"].startswith("prompt is too long") and "exceeds the context window" in err["message"]
    assert (err["context_budget"], err["max_tokens"]) == (64, 60) and err["prompt_tokens"] > 4
    assert s.engine().submitted == []


def test_auth_headers_and_beta_query() -> None:
    s = serve(make_config(api_key="k"))
    anthropic_error(post(s), 401, "authentication_error")
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01", "anthropic-beta": "interleaved-thinking"}
    assert s.client.post("/v1/messages?beta=true", json={"model": "m1", "messages": HI},
                         headers=headers).status_code == 200
    r = s.client.post("/v1/messages/count_tokens?beta=true", json={"model": "m1", "messages": HI},
                      headers=headers)
    assert r.status_code == 200 and r.json()["input_tokens"] > 0


# --- property tests -------------------------------------------------------------------------------

text = st.text(max_size=12)  # unicode, empty included
text_block = st.fixed_dictionaries({"type": st.just("text"), "text": text})
user_blocks = text_block | st.fixed_dictionaries(
    {"type": st.just("tool_result"), "tool_use_id": text, "content": text | st.lists(text_block, max_size=2)},
    optional={"is_error": st.booleans()})
assistant_blocks = text_block | st.fixed_dictionaries(
    {"type": st.just("tool_use"), "id": text, "name": text, "input": st.dictionaries(text, json_values, max_size=2)},
) | st.fixed_dictionaries({"type": st.just("thinking"), "thinking": text, "signature": text}) | st.just(
    {"type": "redacted_thinking", "data": "x"})
valid_messages = st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.just("user"), "content": text | st.lists(user_blocks, max_size=4)}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": text | st.lists(assistant_blocks, max_size=4)}),
), min_size=1, max_size=5)
valid_bodies = st.fixed_dictionaries({"messages": valid_messages}, optional={
    "system": text | st.lists(text_block, max_size=2),
    "stop_sequences": st.lists(text, max_size=64),
    "max_tokens": st.integers(1, 8),
    # A named tool_choice must name an offered tool (a 400 otherwise): "f" is always offered.
    "tools": st.lists(st.fixed_dictionaries({"name": text}, optional={"input_schema": st.just({}),
                                                                      "description": text}), max_size=2).map(
        lambda tools: [{"name": "f", "input_schema": {}}, *tools]),
    "tool_choice": st.sampled_from([{"type": "auto"}, {"type": "any"}, {"type": "none"},
                                    {"type": "tool", "name": "f"}]),
    "temperature": st.floats(0, 1),
    "thinking": st.fixed_dictionaries({"type": st.sampled_from(["enabled", "disabled", "adaptive"])},
                                      optional={"budget_tokens": st.integers(0, 64)}),
    "metadata": st.dictionaries(text, text, max_size=2),
    "stream": st.booleans(),
})
# Anything goes: wrong roles, blocks in the wrong turn, media, garbage values, huge stop lists.
any_block = st.one_of(user_blocks, assistant_blocks, json_values,
                      st.fixed_dictionaries({"type": st.sampled_from(["image", "document", "weird"])}))
any_bodies = st.fixed_dictionaries({"messages": st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"]), "content": text | st.lists(any_block, max_size=4)}),
    max_size=4)}, optional={"system": json_values | text, "stop_sequences": st.lists(text, max_size=200),
                            "max_tokens": json_values, "tools": json_values, "tool_choice": json_values,
                            "thinking": json_values, "output_config": json_values, "stream": st.booleans()})


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=valid_bodies)
def test_valid_bodies_answer_and_count_matches_usage(app_and_log: tuple[Served, Lines],
                                                     body: dict[str, Any]) -> None:
    s, _ = app_and_log
    r = s.client.post("/v1/messages", json={"model": "m1", **body})
    assert r.status_code == 200, r.text
    if body.get("stream"):
        events = named_sse(r.text)
        assert [n for n, _ in events][:3] == GOLDEN[:3] and events[-1][0] == "message_stop"
        usage = events[0][1]["message"]["usage"]
    else:
        usage = r.json()["usage"]
    count = s.client.post("/v1/messages/count_tokens", json={"model": "m1", **body})
    assert count.json()["input_tokens"] == usage["input_tokens"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=any_bodies)
def test_arbitrary_bodies_never_500(app_and_log: tuple[Served, Lines], body: dict[str, Any]) -> None:
    s, _ = app_and_log
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        r = s.client.post(path, json={"model": "m1", **body})
        assert r.status_code < 500, r.text
        if r.status_code != 200:
            assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=bodies)
def test_table_fields_never_500_and_warn_exactly(app_and_log: tuple[Served, Lines],
                                                 fields: dict[str, Any]) -> None:
    s, log = app_and_log
    log.lines.clear()
    r = s.client.post("/v1/messages", json={"model": "m1", "messages": HI, **fields}, headers=another_client())
    assert r.status_code < 500, r.text
    expected = ignored_params("messages", fields)
    assert log.lines == ([f"/v1/messages: ignored parameters: {', '.join(expected)}"] if expected else [])


# --- the official SDK against a live server over the fake engine ---------------------------------

@pytest.fixture(scope="module")
def sdk() -> Iterator[tuple[anthropic.Anthropic, Served]]:
    s = serve(make_config(("m1", "m2"), api_key="k", env=RuntimeEnv(sse_keepalive_s=0.05)))
    with ThreadedServer(s.app) as url:
        yield anthropic.Anthropic(base_url=url, api_key="k", max_retries=0, timeout=30), s


def test_sdk_create_stream_count_and_errors(sdk: tuple[anthropic.Anthropic, Served]) -> None:
    client, _ = sdk
    msg = client.messages.create(model="m1", max_tokens=16, messages=HI)  # type: ignore[arg-type]
    assert msg.content[0].text == "Hello, world!" and msg.stop_reason == "end_turn"  # type: ignore[union-attr]
    with client.messages.stream(model="m1", max_tokens=16, messages=HI) as ms:  # type: ignore[arg-type]
        streamed = "".join(ms.text_stream)
        final = ms.get_final_message()
    assert streamed == "Hello, world!" and final.usage.output_tokens == 4
    count = client.messages.count_tokens(model="m1", messages=HI)  # type: ignore[arg-type]
    assert count.input_tokens == msg.usage.input_tokens
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-x", max_tokens=16, messages=HI)  # type: ignore[arg-type]
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
        client.messages.create(model="m1", max_tokens=100_000, messages=HI)  # type: ignore[arg-type]
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=str(client.base_url), api_key="no", max_retries=0).messages.create(
            model="m1", max_tokens=16, messages=HI)  # type: ignore[arg-type]
