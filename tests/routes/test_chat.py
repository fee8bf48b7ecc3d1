"""POST /v1/chat/completions over the fake engine: bodies, streams, the honored parameters."""

from __future__ import annotations

from typing import Any

from gmlx_server.app import create_app
from gmlx_server.config import Profile, RuntimeEnv
from gmlx_server.errors import ServerOverloaded
from gmlx_server.serving.intents import SAMPLING_TABLE
from gmlx_server.serving.model_host import ModelHost
from tests.fakes import FakeBehavior, FakeFactory, FakeTemplate
from tests.routes.conftest import Served, SyncClient, make_config, serve, sse_events


def _stream(s: Served, body: dict[str, Any]) -> list[Any]:
    r = s.chat({"stream": True, **body})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    return sse_events(r.text)


def _content(events: list[Any]) -> str:
    return "".join(e["choices"][0]["delta"].get("content", "") for e in events
                   if isinstance(e, dict) and e.get("choices"))


def test_non_streaming_body(served: Served) -> None:
    r = served.chat()
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == "m1"
    assert body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Hello, world!"}
    assert choice["finish_reason"] == "stop"
    prompt = len(served.engine().submitted[0].prompt_tokens)
    assert body["usage"] == {"prompt_tokens": prompt, "completion_tokens": 4, "total_tokens": prompt + 4,
                             "prompt_tokens_details": {"cached_tokens": 0},
                             "completion_tokens_details": {"reasoning_tokens": 0}}


def test_stream_reassembles_and_ends_with_done(served: Served) -> None:
    events = _stream(served, {})
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert _content(events) == "Hello, world!"
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert all("usage" not in e for e in events[:-1])


def test_stream_include_usage_adds_final_usage_chunk(served: Served) -> None:
    events = _stream(served, {"stream_options": {"include_usage": True}})
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 4
    assert all(e["usage"] is None for e in events[:-2])


def test_timings_per_token_counts_every_token(served: Served) -> None:
    served.factory.behavior.pieces = ["a", "b", "c", "d", "e"]
    events = _stream(served, {"timings_per_token": True})
    counts = [e["timings"]["predicted_n"] for e in events[:-1]]
    assert counts == [0, 1, 2, 3, 4, 5, 5]  # role chunk, five tokens, finish chunk


def test_max_tokens_precedence(served: Served) -> None:
    cases = [({"max_completion_tokens": 2, "max_tokens": 3, "max_output_tokens": 1}, 2),
             ({"max_tokens": 3, "max_output_tokens": 1}, 3), ({"max_output_tokens": 1}, 1)]
    for body, expected in cases:
        r = served.chat(body)
        assert r.json()["choices"][0]["finish_reason"] == "length"
        assert served.engine().submitted[-1].max_tokens == expected
        assert r.json()["usage"]["completion_tokens"] == expected


def test_default_cap_leaves_the_conversation_half_the_room(served: Served) -> None:
    served.chat()  # default_max_tokens (4096) is the whole fake window: half of what the prompt leaves wins
    req = served.engine().submitted[-1]
    assert req.max_tokens == (4096 - len(req.prompt_tokens)) // 2


def test_stop_strings_end_the_text(served: Served) -> None:
    r = served.chat({"stop": ["wor"]})
    assert r.json()["choices"][0]["message"]["content"] == "Hello, "
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    served.factory.behavior.pieces = ["ab", "cE", "N", "Dxyz"]
    events = _stream(served, {"stop": "END"})
    assert _content(events) == "abc"
    assert served.engine().submitted[-1].stop == ("END",)


def test_sampling_seed_and_logit_bias_reach_the_engine(served: Served) -> None:
    served.chat({"temperature": 0.3, "top_k": 5, "seed": 7, "logit_bias": {"42": -100, "7": 2.5},
                 "xtc_probability": 0.5, "p_less": True})
    sp = served.engine().submitted[-1].sampling
    assert (sp.temperature, sp.top_k, sp.seed, sp.xtc_probability, sp.p_less) == (0.3, 5, 7, 0.5, True)
    assert sp.logit_bias == {42: -100.0, 7: 2.5}


def test_family_base_applies_without_profile(served: Served) -> None:
    served.chat()
    sp = served.engine().submitted[-1].sampling
    assert sp.temperature == SAMPLING_TABLE["llama"]["base"]["temperature"]


def test_profiles_and_explicit_fields() -> None:
    prof = Profile("qc", intent="coding", sampling={"top_p": 0.5}, system="be careful",
                   chat_template_kwargs={"enable_thinking": False, "x": 1}, stop=("END", "\n"))
    s = serve(make_config(("m1",), profiles={"qc": prof}, aliases={"coder": "m1@qc"}))
    s.chat({"model": "m1@coding"})
    sp = s.engine().submitted[-1].sampling
    assert sp.temperature == SAMPLING_TABLE["llama"]["coding"]["temperature"]
    assert s.engine().submitted[-1].stop == ()  # a built-in intent has no stop strings
    s.chat({"model": "coder", "temperature": 0.9, "chat_template_kwargs": {"x": 2}, "stop": ["\n", "Q:"]})
    assert s.engine().submitted[-1].stop == ("\n", "Q:", "END")  # the profile's are added to the request's
    sp = s.engine().submitted[-1].sampling
    assert (sp.temperature, sp.top_p) == (0.9, 0.5)  # explicit beats profile; profile beats intent
    call = s.engine().template.calls[-1]
    assert call["messages"][0] == {"role": "system", "content": "be careful"}
    assert call["variables"] == {"enable_thinking": False, "x": 2}
    s.chat({"model": "m1", "profile": "creative"})
    assert s.engine().submitted[-1].sampling.min_p == SAMPLING_TABLE["llama"]["creative"]["min_p"]


def test_thinking_controls_map_to_template_variables(served: Served) -> None:
    served.chat({"enable_thinking": True})
    tpl: FakeTemplate = served.engine().template
    assert tpl.calls[-1]["variables"] == {"enable_thinking": True}
    assert served.engine().submitted[-1].starts_in_thinking
    served.chat({"reasoning_effort": "none"})
    assert tpl.calls[-1]["variables"] == {"enable_thinking": False, "reasoning_effort": "none"}
    served.chat({"reasoning": {"effort": "high"}, "thinking_budget": 64})
    assert tpl.calls[-1]["variables"] == {"enable_thinking": True, "reasoning_effort": "high"}
    assert served.engine().submitted[-1].thinking.budget == 64
    tpl.variables = frozenset()
    served.chat({"enable_thinking": True, "reasoning_effort": "low"})
    assert tpl.calls[-1]["variables"] == {}  # the template reads neither: nothing is passed


def test_tool_choice_none_strips_tools(template_tools: Served) -> None:
    served = template_tools
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    served.chat({"tools": tools})
    assert served.engine().template.calls[-1]["tools"] == tools
    served.chat({"tools": tools, "tool_choice": "none"})
    assert served.engine().template.calls[-1]["tools"] is None


def test_assistant_tool_call_arguments_become_objects(served: Served) -> None:
    msgs = [{"role": "user", "content": "w?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
            {"role": "tool", "tool_call_id": "1", "content": "sunny"}]
    assert served.chat({"messages": msgs}).status_code == 200
    sent = served.engine().template.calls[-1]["messages"]
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}


def test_text_parts_are_joined_and_developer_is_system(served: Served) -> None:
    msgs = [{"role": "developer", "content": "d"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    served.chat({"messages": msgs})
    sent = served.engine().template.calls[-1]["messages"]
    assert sent == [{"role": "system", "content": "d"}, {"role": "user", "content": "a\nb"}]


def test_logprobs_capped_by_top_logprobs_k() -> None:
    s = serve(make_config(env=RuntimeEnv(top_logprobs_k=2)))
    body = s.chat({"logprobs": True, "top_logprobs": 5}).json()
    items = body["choices"][0]["logprobs"]["content"]
    assert len(items) == 4 and len(items[0]["top_logprobs"]) == 2
    assert items[0]["token"] == "H" and items[0]["bytes"] == [72]  # the fake's token id is its piece's first char
    events = _stream(s, {"logprobs": True})
    assert events[1]["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []


def test_context_overflow_is_refused_before_submit() -> None:
    s = serve(factory=FakeFactory(context_length=64))
    r = s.chat({"max_tokens": 60})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["message"].startswith("prompt is too long")
    assert "exceeds the context window" in err["message"] and "64" in err["message"]
    assert s.engine().submitted == []
    long = {"messages": [{"role": "user", "content": "x" * 100}]}
    assert s.chat(long).json()["error"]["message"].startswith("prompt is too long")


def test_engine_error_mid_stream_becomes_error_event() -> None:
    s = serve(factory=FakeFactory(FakeBehavior(fail_after=2)))
    events = _stream(s, {})
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["type"] == "engine_error"
    assert _content(events[:-2]) == "Hello,"
    r = s.chat()
    assert r.status_code == 500 and r.json()["error"]["type"] == "engine_error"


def test_shed_ends_stream_with_finish_reason_and_error() -> None:
    s = serve(factory=FakeFactory(FakeBehavior(shed_after=1)))
    events = _stream(s, {})
    assert events[-3]["choices"][0]["finish_reason"] == "shed"
    assert events[-2]["error"]["type"] == "server_overloaded_shed"
    r = s.chat()
    assert r.status_code == 503 and "Retry-After" in r.headers


def test_submit_overload_is_503_with_retry_after() -> None:
    s = serve(factory=FakeFactory(FakeBehavior(submit_error=ServerOverloaded("queue full", 7))))
    r = s.chat()
    assert r.status_code == 503 and r.headers["Retry-After"] == "7"
    assert r.json()["error"]["type"] == "server_overloaded"


def test_a_refused_submit_leaves_no_caller_behind() -> None:
    """The caller's label joins the live requests only once the engine took the request."""
    config = make_config()
    host = ModelHost(config, FakeFactory(FakeBehavior(submit_error=ServerOverloaded("queue full", 7))),
                     check_headers=False)
    client = SyncClient(create_app(config, host=host))
    try:
        assert client.post("/v1/chat/completions", json={"model": "m1", "messages": [
            {"role": "user", "content": "hi"}]}).status_code == 503
        assert host.telemetry.callers == {}
    finally:
        client.close()


def test_keepalive_comments_during_long_prefill() -> None:
    s = serve(make_config(env=RuntimeEnv(sse_keepalive_s=0.02)), FakeFactory(FakeBehavior(prefill_s=0.2)))
    r = s.chat({"stream": True})
    first_content = r.text.index('"content":"Hello"')
    assert r.text.count(": keepalive\n\n", 0, first_content) >= 3
    assert _content(sse_events(r.text)) == "Hello, world!"
