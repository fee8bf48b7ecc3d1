"""The request log: one INFO line per finished generation request, key=value, no prompt text unless at
DEBUG; its fields in the JSON log format."""

from __future__ import annotations

import json
import logging
import re

import pytest

from gmlx_server.log_format import FIELDS, JsonFormatter
from tests.fakes import FakeBehavior, FakeFactory
from tests.routes import test_messages as anthropic_route
from tests.routes.conftest import Served, make_config, serve

SECRET = "the prompt text that must not be logged"


def lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "gmlx.request"]


def fields_of(record: logging.LogRecord) -> dict[str, str]:
    """The text line's key=value pairs (values are single tokens or JSON strings)."""
    text = record.getMessage()
    assert text.startswith("request ")
    return {k: json.loads(v) if v.startswith('"') else v
            for k, v in re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', text)}


def test_one_line_per_chat_request_with_tokens_and_timings(served: Served,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="gmlx.request"):
        body = served.chat({"messages": [{"role": "user", "content": SECRET}]}).json()
        served.client.get("/v1/models")  # not a generation route: no line
    [line] = lines(caplog)
    f = fields_of(line)
    assert f["id"] == body["id"] and f["route"] == "/v1/chat/completions" and f["model"] == "m1"
    assert (f["status"], f["finish"], f["profile"]) == ("200", "stop", "-")
    assert int(f["prompt_tokens"]) == body["usage"]["prompt_tokens"] > 0
    assert int(f["generated_tokens"]) == body["usage"]["completion_tokens"] == 4
    assert f["cached_tokens"] == "0" and float(f["duration_s"]) >= 0 and f["decode_tok_s"] != ""
    assert "clamp" not in f and "shed" not in f and "tool_calls" not in f and "prompt" not in f
    assert SECRET not in line.getMessage()
    assert getattr(line, FIELDS)["generated_tokens"] == 4  # the structured copy, for the JSON format


def test_a_stream_logs_when_it_ends_and_a_refusal_logs_its_error(served: Served,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="gmlx.request"):
        events = anthropic_route.stream(served)
        assert lines(caplog) and fields_of(lines(caplog)[0])["route"] == "/v1/messages"
        served.chat({"model": "nope"})
    first, refused = (fields_of(r) for r in lines(caplog))
    assert first["id"] == events[0][1]["message"]["id"] and first["finish"] == "stop"
    assert (refused["status"], refused["error"], refused["model"]) == ("404", "model_not_found", "nope")


def test_clamp_and_shed_are_on_the_line(caplog: pytest.LogCaptureFixture) -> None:
    s = serve(make_config(clamp_max_tokens=True), FakeFactory(context_length=64))
    try:
        with caplog.at_level(logging.INFO, logger="gmlx.request"):
            s.chat({"max_tokens": 500})
            s.factory.behavior.shed_after = 1
            s.chat({"stream": True})
        clamped, shed = (fields_of(r) for r in lines(caplog))
        assert re.fullmatch(r"500->\d+", clamped["clamp"]) and clamped["finish"] == "stop"
        assert (shed["shed"], shed["finish"]) == ("1", "shed")
    finally:
        s.client.close()


def test_tool_calls_are_counted_on_the_line(caplog: pytest.LogCaptureFixture) -> None:
    call = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    s = serve(factory=FakeFactory(behavior=FakeBehavior(pieces=[call])))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    try:
        with caplog.at_level(logging.INFO, logger="gmlx.request"):
            s.chat({"tools": tools})
        f = fields_of(lines(caplog)[0])
        assert (f["tool_calls"], f["finish"], f["tool_parser"]) == ("1", "tool_calls", "json")
    finally:
        s.client.close()


def test_debug_adds_the_prompt_and_json_carries_every_field(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="gmlx.request"):
        served.chat({"messages": [{"role": "user", "content": SECRET}]})
    [line] = lines(caplog)
    assert SECRET in fields_of(line)["prompt"]
    out = json.loads(JsonFormatter().format(line))
    assert (out["level"], out["logger"], out["route"], out["status"]) == ("INFO", "gmlx.request",
                                                                          "/v1/chat/completions", 200)
    assert out["generated_tokens"] == 4 and SECRET in out["prompt"] and out["message"].startswith("request id=")
