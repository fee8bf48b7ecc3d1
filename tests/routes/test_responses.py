"""POST /v1/responses over the fake engine: the response object, the exact event sequence,
input items -> template messages, previous_response_id and its bounded store, errors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai._models import construct_type_unchecked
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent

from gmlx_server.config import RuntimeEnv
from gmlx_server.engine.types import TokenEvent
from gmlx_server.protocol.params import ignored_params
from gmlx_server.protocol.responses_out import ResponsesEncoder, ResponsesMeta
from gmlx_server.protocol.shared import ToolCall
from gmlx_server.serving.conversations import ResponseStore
from tests.fakes import FakeBehavior, FakeFactory, FakeTemplate
from tests.routes.conftest import Lines, Served, ThreadedServer, make_config, serve
from tests.routes.test_messages import named_sse
from tests.routes.test_params import another_client, bodies, json_values

ITEM_EVENTS = ["response.output_item.added", "response.content_part.added"]
CLOSE_EVENTS = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
GOLDEN = ["response.created", "response.in_progress", *ITEM_EVENTS, *["response.output_text.delta"] * 4,
          *CLOSE_EVENTS, "response.completed"]


def post(s: Served, body: dict[str, Any] | None = None) -> Any:
    return s.client.post("/v1/responses", json={"model": "m1", "input": "hi", **(body or {})})


def stream(s: Served, body: dict[str, Any] | None = None) -> list[tuple[str, Any]]:
    r = post(s, {"stream": True, **(body or {})})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    events = named_sse(r.text)
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    return events


def sdk_final(events: list[tuple[str, Any]]) -> Any:
    """Feed the events through the openai SDK's own stream accumulator; its final response."""
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=[], text_format=openai.NOT_GIVEN)
    for _, data in events:
        state.handle_event(construct_type_unchecked(type_=ResponseStreamEvent, value=data))  # type: ignore[arg-type]
    return state._completed_response


def template_messages(s: Served) -> list[dict[str, Any]]:
    tpl: FakeTemplate = s.engine().template
    return list(tpl.calls[-1]["messages"])  # type: ignore[call-overload]


# --- bodies and streams ---------------------------------------------------------------------------

def test_non_streaming_response_object(served: Served) -> None:
    body = post(served, {"instructions": "be brief", "max_output_tokens": 50, "temperature": 0.5}).json()
    prompt = len(served.engine().submitted[0].prompt_tokens)
    assert body["id"].startswith("resp_") and body["object"] == "response" and body["status"] == "completed"
    assert (body["model"], body["instructions"], body["max_output_tokens"], body["temperature"]) == \
        ("m1", "be brief", 50, 0.5)
    [item] = body["output"]
    assert item["type"] == "message" and item["role"] == "assistant" and item["status"] == "completed"
    assert item["id"].startswith("msg_") and item["content"] == [
        {"type": "output_text", "text": "Hello, world!", "annotations": [], "logprobs": []}]
    assert body["usage"] == {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0},
                             "output_tokens": 4, "output_tokens_details": {"reasoning_tokens": 0},
                             "total_tokens": prompt + 4}
    assert body["error"] is None and body["incomplete_details"] is None


def test_stream_golden_event_order(served: Served) -> None:
    events = stream(served)
    assert [n for n, _ in events] == GOLDEN
    created = events[0][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and created["usage"] is None
    item_id = events[2][1]["item"]["id"]
    assert all(d.get("item_id", item_id) == item_id for _, d in events[2:-1])
    assert "".join(d["delta"] for n, d in events if n == "response.output_text.delta") == "Hello, world!"
    assert events[-4][1]["text"] == "Hello, world!"
    final = events[-1][1]["response"]
    assert final["id"] == created["id"] and final["status"] == "completed" and final["usage"]["output_tokens"] == 4
    assert sdk_final(events).output_text == "Hello, world!"


def test_output_cap_makes_the_response_incomplete(served: Served) -> None:
    body = post(served, {"max_output_tokens": 2}).json()
    assert (body["status"], body["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    assert served.engine().submitted[-1].max_tokens == 2
    events = stream(served, {"max_output_tokens": 2})
    assert events[-1][0] == "response.incomplete" and events[-1][1]["response"]["output"][0]["status"] == "completed"


def test_empty_generation_still_answers_one_message(served: Served) -> None:
    served.factory.behavior.pieces = []
    assert [n for n, _ in stream(served)] == ["response.created", "response.in_progress", *ITEM_EVENTS,
                                              *CLOSE_EVENTS, "response.completed"]
    assert post(served).json()["output"][0]["content"][0]["text"] == ""


def test_function_call_items_from_a_parsed_call() -> None:
    """A whole parsed call (tool_call) as a function_call item; test_tools.py drives it from model text."""
    enc = ResponsesEncoder(ResponsesMeta("resp_1", "m1", 0, 5))
    events = [*enc.start(), *enc.text("Checking."), *enc.tool_call(ToolCall("weather", '{"city": "Paris"}')),
              *enc.feed(TokenEvent("", None, finish_reason="stop"))]
    assert [n for n, _ in events] == [
        "response.created", "response.in_progress", *ITEM_EVENTS, "response.output_text.delta", *CLOSE_EVENTS,
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    final = sdk_final([(n, {**d, "sequence_number": i}) for i, (n, d) in enumerate(events)])
    call = final.output[1]
    assert (call.type, call.name, call.arguments) == ("function_call", "weather", '{"city": "Paris"}')
    assert call.call_id.startswith("call_")
    assert enc.output_messages() == [{"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": call.call_id, "type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]}]


def test_a_streamed_call_from_the_parser_gets_prefixed_ids_and_fragments() -> None:
    enc = ResponsesEncoder(ResponsesMeta("resp_1", "m1", 0, 5))
    events = [*enc.tool_start("abc", "f"), *enc.tool_arguments('{"a": '), *enc.tool_arguments("1}"), *enc.tool_end(),
              *enc.tool_start("", "g"), *enc.tool_end({"b": "é"})]
    assert [d["delta"] for n, d in events if n == "response.function_call_arguments.delta"] == ['{"a": ', "1}"]
    out = enc.body()["output"]
    assert [(o["call_id"], o["arguments"], o["status"]) for o in out] == [
        ("call_abc", '{"a": 1}', "completed"), (out[1]["call_id"], '{"b": "é"}', "completed")]
    assert out[1]["call_id"].startswith("call_")


def test_error_after_start_is_error_then_failed() -> None:
    s = serve(factory=FakeFactory(FakeBehavior(fail_after=2)))
    events = stream(s)
    assert [n for n, _ in events[-2:]] == ["error", "response.failed"]
    assert events[-2][1]["code"] == "engine_error" and events[-2][1]["message"] == "generation failed: boom"
    assert events[-1][1]["response"]["error"] == {"code": "engine_error", "message": "generation failed: boom"}


def test_keepalive_comments_while_silent() -> None:
    s = serve(make_config(env=RuntimeEnv(sse_keepalive_s=0.02)), FakeFactory(FakeBehavior(prefill_s=0.2)))
    r = post(s, {"stream": True})
    assert r.text.count(": keepalive\n\n", 0, r.text.index("output_text.delta")) >= 3


# --- input -> template messages -------------------------------------------------------------------

def test_items_render_as_transformers_expects(template_tools: Served) -> None:
    served = template_tools
    items = [{"role": "developer", "content": "dev"},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                             {"type": "input_text", "text": "b"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "calling"}]},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'},
             {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
             {"type": "reasoning", "summary": []},
             {"type": "function_call_output", "call_id": "c1", "output": "one"},
             {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]}]
    tools = [{"type": "function", "name": "f", "description": "F", "parameters": {"type": "object"}},
             {"type": "web_search_preview"}]
    assert post(served, {"input": items, "instructions": "sys", "tools": tools}).status_code == 200
    assert template_messages(served) == [
        {"role": "system", "content": "sys"}, {"role": "system", "content": "dev"},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "calling", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "one", "name": "f"},
        {"role": "tool", "tool_call_id": "c2", "content": "two", "name": "g"}]
    tpl: FakeTemplate = served.engine().template
    assert tpl.calls[-1]["tools"] == [{"type": "function", "function": {"name": "f", "description": "F",
                                                                        "parameters": {"type": "object"}}}]


def test_sampling_and_tool_choice_reach_the_engine(served: Served) -> None:
    post(served, {"temperature": 0.3, "top_p": 0.8, "seed": 5, "stop": ["ignored"], "max_tokens": 7})
    req = served.engine().submitted[-1]
    assert (req.sampling.temperature, req.sampling.top_p, req.sampling.seed, req.stop, req.max_tokens) == \
        (0.3, 0.8, 5, (), 7)
    tools = [{"type": "function", "name": "f", "parameters": {}}]
    post(served, {"tools": tools, "tool_choice": "none"})
    tpl: FakeTemplate = served.engine().template
    assert tpl.calls[-1]["tools"] is None


# --- previous_response_id -------------------------------------------------------------------------

def test_previous_response_id_continues_the_conversation(served: Served) -> None:
    first = post(served, {"instructions": "only now", "input": "My name is Ada."}).json()
    events = stream(served, {"previous_response_id": first["id"], "input": "What is my name?"})
    assert events[-1][1]["response"]["previous_response_id"] == first["id"]
    assert template_messages(served) == [  # instructions are not carried over
        {"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": "Hello, world!"},
        {"role": "user", "content": "What is my name?"}]
    second = events[-1][1]["response"]["id"]
    post(served, {"previous_response_id": second, "input": "Third."})
    assert len(template_messages(served)) == 5


def test_unknown_unstored_and_evicted_ids_are_404() -> None:
    s = serve()
    err = post(s, {"previous_response_id": "resp_nope"})
    assert err.status_code == 404
    assert err.json()["error"]["type"] == "not_found_error"
    assert err.json()["error"]["code"] == "previous_response_not_found"
    unstored = post(s, {"store": False}).json()["id"]
    assert post(s, {"previous_response_id": unstored}).status_code == 404


def test_the_store_is_a_bounded_lru() -> None:
    store = ResponseStore(capacity=2)
    for rid in ("a", "b"):
        store.put(rid, [{"role": "user", "content": rid}])
    store.get("a")  # a is now the most recent
    store.put("c", [])
    assert len(store) == 2 and store.get("a") and store.get("c") == ()
    with pytest.raises(Exception, match="previous response 'b' not found"):
        store.get("b")


def test_each_app_has_its_own_store() -> None:
    a, b = serve(), serve()
    rid = post(a).json()["id"]
    assert post(a, {"previous_response_id": rid}).status_code == 200
    assert post(b, {"previous_response_id": rid}).status_code == 404


# --- errors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, param, type_", [
    ({"input": None}, "input", "invalid_request_error"),
    ({"input": []}, "input", "invalid_request_error"),
    ({"input": 5}, "input", "invalid_request_error"),
    ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role", "invalid_request_error"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id", "invalid_request_error"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].image_url", "invalid_request_error"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}]},
     "input[0].content[0]", "unsupported_feature"),  # a text-only model takes no image
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]", "unsupported_feature"),
    ({"text": {"format": {"type": "json_schema", "schema": {"type": "nope"}}}}, "text.format.schema",
     "invalid_request_error"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type", "invalid_request_error"),
    ({"tool_choice": "always"}, "tool_choice", "invalid_request_error"),
    ({"max_output_tokens": 0}, "max_output_tokens", "invalid_request_error"),
    ({"previous_response_id": 5}, "previous_response_id", "invalid_request_error"),
])
def test_bad_bodies_are_typed_400s(served: Served, body: dict[str, Any], param: str, type_: str) -> None:
    r = post(served, body)
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["type"], r.json()["error"]["param"]) == (type_, param)


def test_unknown_model_and_overflow_in_openai_shape() -> None:
    s = serve(factory=FakeFactory(context_length=64))
    r = post(s, {"model": "zzz"})
    assert r.status_code == 404 and r.json()["error"]["available_models"] == ["m1"]
    r = post(s, {"max_output_tokens": 60})
    err = r.json()["error"]
    assert r.status_code == 400 and err["message"].startswith("prompt is too long")
    assert "exceeds the context window" in err["message"] and err["code"] == "context_length_exceeded"


# --- property tests -------------------------------------------------------------------------------

text = st.text(max_size=10)
items = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "developer", "x"]),
                           "content": text | st.lists(st.fixed_dictionaries(
                               {"type": st.sampled_from(["input_text", "output_text", "input_image"]),
                                "text": text}), max_size=3)}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": text, "name": text, "arguments": text}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": text, "output": text}),
    json_values,
)
response_bodies = st.fixed_dictionaries({"input": text | st.lists(items, max_size=4)}, optional={
    "instructions": text | json_values, "tools": json_values, "tool_choice": json_values, "stream": st.booleans(),
    "previous_response_id": text, "text": json_values, "store": json_values, "max_output_tokens": json_values})


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=response_bodies)
def test_generated_bodies_never_500(app_and_log: tuple[Served, Lines], body: dict[str, Any]) -> None:
    s, _ = app_and_log
    assert post(s, body).status_code < 500


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=bodies)
def test_table_fields_never_500_and_warn_exactly(app_and_log: tuple[Served, Lines],
                                                 fields: dict[str, Any]) -> None:
    s, log = app_and_log
    log.lines.clear()
    r = s.client.post("/v1/responses", json={"model": "m1", "input": "hi", **fields}, headers=another_client())
    assert r.status_code < 500
    expected = ignored_params("responses", fields)
    assert log.lines == ([f"/v1/responses: ignored parameters: {', '.join(expected)}"] if expected else [])


# --- the official SDK against a live server over the fake engine ---------------------------------

@pytest.fixture(scope="module")
def sdk() -> Iterator[openai.OpenAI]:
    s = serve(make_config(env=RuntimeEnv(sse_keepalive_s=0.05)))
    with ThreadedServer(s.app) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_sdk_create_stream_and_previous_response(sdk: openai.OpenAI) -> None:
    r = sdk.responses.create(model="m1", input="hi", instructions="x")
    assert r.output_text == "Hello, world!" and r.usage is not None and r.usage.output_tokens == 4
    with sdk.responses.stream(model="m1", input="again", previous_response_id=r.id) as rs:
        deltas = "".join(e.delta for e in rs if e.type == "response.output_text.delta")
        final = rs.get_final_response()
    assert deltas == final.output_text == "Hello, world!" and final.previous_response_id == r.id
    with pytest.raises(openai.NotFoundError):
        sdk.responses.create(model="m1", input="x", previous_response_id="resp_gone")
