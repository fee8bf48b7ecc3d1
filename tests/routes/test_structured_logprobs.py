"""Structured output and logprobs over the fake engine: what reaches the engine, what the 400s say,
and OpenAI's logprobs shape (stream and not) under the TOP_LOGPROBS_K cap."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gmlx_server.config import RuntimeEnv
from gmlx_server.engine.types import TokenEvent
from gmlx_server.protocol.openai_out import OpenAIEncoder, ResponseMeta
from tests.fakes import FakeFactory, FakeTokenizer
from tests.routes import test_responses as responses_route
from tests.routes.conftest import Served, make_config, serve, sse_events

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}}


@pytest.fixture
def capped() -> Iterator[Any]:
    """serve() with TOP_LOGPROBS_K set to the given cap; clients closed afterwards."""
    made: list[Served] = []

    def build(cap: int) -> Served:
        made.append(serve(make_config(env=RuntimeEnv(sse_keepalive_s=0.05, top_logprobs_k=cap))))
        return made[-1]

    yield build
    for s in made:
        s.client.close()


# --- structured output ----------------------------------------------------------------------------

def test_response_format_reaches_the_engine_compiled(served: Served) -> None:
    assert served.chat({"response_format": JSON_SCHEMA}).status_code == 200
    grammar = served.engine().submitted[-1].grammar
    assert grammar is not None and (grammar.kind, grammar.schema) == ("json_schema", SCHEMA) and grammar.grammar
    served.chat({"response_format": {"type": "json_object"}})
    assert served.engine().submitted[-1].grammar.kind == "json_object"


def test_responses_text_format_is_structured_output_and_echoed(served: Served) -> None:
    fmt = {"type": "json_schema", "name": "place", "schema": SCHEMA}
    body = responses_route.post(served, {"text": {"format": fmt}}).json()
    assert served.engine().submitted[-1].grammar.schema == SCHEMA
    assert body["text"] == {"format": fmt}


def test_a_malformed_schema_is_refused_before_generation(served: Served) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "required": "city"}}}
    r = served.chat({"response_format": bad})
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "invalid_request_error"
    assert err["param"] == "response_format.json_schema.schema" and "malformed JSON schema" in err["message"]
    assert served.factory.engines == {}  # refused while parsing: no model was even loaded


def test_a_speculative_model_refuses_structured_output() -> None:
    s = serve(factory=FakeFactory(drafts=True))
    r = s.chat({"response_format": JSON_SCHEMA})
    assert r.status_code == 400 and r.json()["error"]["type"] == "unsupported_feature"
    assert r.json()["error"]["param"] == "response_format" and s.engine().submitted == []
    assert s.chat().status_code == 200  # plain requests still go through
    s.client.close()


# --- logprobs -------------------------------------------------------------------------------------

def _items(body: dict[str, Any]) -> list[dict[str, Any]]:
    return list(body["choices"][0]["logprobs"]["content"])


def _streamed_items(events: list[Any]) -> list[dict[str, Any]]:
    return [item for e in events if isinstance(e, dict) and e["choices"] and e["choices"][0]["logprobs"]
            for item in e["choices"][0]["logprobs"]["content"]]


@pytest.mark.parametrize("cap, asked, expected", [(3, 5, 3), (3, 2, 2), (0, 5, 0), (20, 20, 20)])
def test_top_lists_are_capped_and_sorted(capped: Any, cap: int, asked: int, expected: int) -> None:
    s = capped(cap)
    body = s.chat({"logprobs": True, "top_logprobs": asked}).json()
    assert s.engine().submitted[-1].top_logprobs == expected
    items = _items(body)
    assert len(items) == body["usage"]["completion_tokens"] == 4
    for item in items:
        assert set(item) == {"token", "logprob", "bytes", "top_logprobs"}
        assert item["bytes"] == list(item["token"].encode())
        tops = [t["logprob"] for t in item["top_logprobs"]]
        assert len(tops) == expected and tops == sorted(tops, reverse=True)
    streamed = _streamed_items(sse_events(s.chat({"logprobs": True, "top_logprobs": asked, "stream": True}).text))
    assert streamed == items


def test_no_logprobs_unless_asked(capped: Any) -> None:
    s = capped(5)
    assert s.chat().json()["choices"][0]["logprobs"] is None
    assert s.engine().submitted[-1].logprobs is False
    events = sse_events(s.chat({"stream": True}).text)
    assert all(e["choices"][0]["logprobs"] is None for e in events[:-1] if e["choices"])


def test_impossible_alternatives_get_openai_floor_not_infinity() -> None:
    enc = OpenAIEncoder(ResponseMeta("c", "m", 0, 1, logprobs=True), FakeTokenizer())
    enc.feed(TokenEvent("a", 97, -0.1, ((97, -0.1), (98, float("-inf")))))
    assert [t["logprob"] for t in enc.logprob_items[0]["top_logprobs"]] == [-0.1, -9999.0]
