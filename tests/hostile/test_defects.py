"""The hostile inputs that once gave 500s, each now a typed 400 naming the field (fake engine: fast)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from gmlx_server.protocol import jsonsafe
from gmlx_server.routes.error_mapper import render
from tests.routes.conftest import Served, make_config, serve

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def app() -> Iterator[Served]:
    s = serve(make_config())
    yield s
    s.client.close()


def _post(app: Served, path: str, raw: str | bytes) -> Any:
    return app.client.post(path, content=raw, headers={"content-type": "application/json"})


def _refused(r: Any, param: str | None, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == 400, r.text
    err: dict[str, Any] = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    if code is not None:
        assert err["code"] == code
    return err


def nest(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


def chat(**fields: Any) -> str:
    return json.dumps({"model": "m1", "messages": USER, **fields})


def test_nesting_at_the_limit_is_parsed_one_past_is_refused(app: Served) -> None:
    # The body object is level 1, so a field may hold MAX_DEPTH - 1 levels.
    def body(depth: int) -> str:
        return '{"model": "m1", "messages": [{"role": "user", "content": "hi"}], "metadata": ' + nest(depth) + "}"

    assert _post(app, "/v1/chat/completions", body(jsonsafe.MAX_DEPTH - 1)).status_code == 200
    err = _refused(_post(app, "/v1/chat/completions", body(jsonsafe.MAX_DEPTH)), "metadata", "json_too_deep")
    assert str(jsonsafe.MAX_DEPTH) in err["message"]


def test_a_thousand_levels_anywhere_is_a_400(app: Served) -> None:
    _refused(_post(app, "/v1/chat/completions", nest(5000)), None, "json_too_deep")
    deep_messages = '{"model": "m1", "messages": ' + nest(990, '{"role": "user", "content": "x"}') + "}"
    _refused(_post(app, "/v1/chat/completions", deep_messages), "messages", "json_too_deep")
    r = _post(app, "/v1/messages", '{"model": "m1", "max_tokens": 1, "messages": ' + nest(2000) + "}")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["type"] == "error"


def test_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps({"a": "[" * 5000 + '\\"{' * 300, "b": [["\\"]]})
    assert jsonsafe.too_deep_at(text.encode()) is None
    assert jsonsafe.too_deep_at(nest(129).encode()) == 128


def test_the_scan_carries_state_across_chunks() -> None:
    # A string that straddles the first chunk boundary holds brackets; the deep part comes after it.
    pad = "x" * (1 << 22)
    body = f'{{"pad": "{pad}[[[", "deep": {nest(200)}}}'
    at = jsonsafe.too_deep_at(body.encode())
    assert at is not None and body[at] == "[" and at > len(pad)
    with pytest.raises(Exception) as e:
        jsonsafe.check_depth(body.encode())
    assert getattr(e.value, "param", None) == "deep"


def test_depth_of_parsed_values() -> None:
    assert jsonsafe.depth_of(1) == 0 and jsonsafe.depth_of({"a": [1, {"b": []}]}) == 4
    assert jsonsafe.depth_of(json.loads(nest(900))) == 900  # iterative: no RecursionError


def test_tool_call_arguments_and_schemas_are_bounded(app: Served) -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": nest(3000)}}
    msgs = [{"role": "assistant", "content": "", "tool_calls": [call]}, *USER]
    _refused(_post(app, "/v1/chat/completions", chat(messages=msgs)),
             "messages[0].tool_calls[0].function.arguments", "json_too_deep")
    schema: dict[str, Any] = {}
    leaf = schema
    for _ in range(40):  # 80 levels: under the body limit, over the schema limit
        leaf["type"], leaf["properties"] = "object", {"a": {}}
        leaf = leaf["properties"]["a"]
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    _refused(_post(app, "/v1/chat/completions", chat(response_format=fmt)), "response_format", "json_too_deep")
    responses = {"model": "m1", "input": [{"type": "function_call", "call_id": "c", "name": "f",
                                           "arguments": '{"a": "\\ud800"}'}, {"role": "user", "content": "x"}]}
    _refused(_post(app, "/v1/responses", json.dumps(responses)), "input[0].arguments", "invalid_unicode")


@pytest.mark.parametrize("function", [5, "ab", [[1, 2, 3]], True])
def test_a_tool_call_function_must_be_an_object(app: Served, function: Any) -> None:
    msgs = [{"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
                                                                 "function": function}]}, *USER]
    _refused(_post(app, "/v1/chat/completions", chat(messages=msgs)), "messages[0].tool_calls[0].function")


def test_a_tool_call_name_and_arguments_are_typed(app: Served) -> None:
    for fn, param in (({"name": 5}, "name"), ({"name": "f", "arguments": 7}, "arguments")):
        msgs = [{"role": "assistant", "content": "", "tool_calls": [{"id": "c", "function": fn}]}, *USER]
        _refused(_post(app, "/v1/chat/completions", chat(messages=msgs)),
                 f"messages[0].tool_calls[0].function.{param}")


def test_lone_surrogates_are_refused_with_their_path(app: Served) -> None:
    body = '{"model": "m1", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    err = _refused(_post(app, "/v1/chat/completions", body), "messages[0].content", "invalid_unicode")
    assert "surrogate" in err["message"]
    for path in ("/unload", "/v1/keep", "/v1/cache/reset"):
        _refused(_post(app, path, '{"model": "\\udc00"}'), "model", "invalid_unicode")
    r = _post(app, "/v1/messages", '{"model": "m1", "max_tokens": 1, "messages": [{"role": "user", '
                                   '"content": [{"type": "text", "text": "\\ud83d"}]}]}')
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    _refused(_post(app, "/v1/chat/completions", '{"model": "m1", "messages": [], "\\ud800": 1}'), "\\ud800")


def test_surrogate_pairs_and_escaped_backslashes_are_fine(app: Served) -> None:
    for content in ("\\ud83d\\ude00", "\\\\ud800", "\\\\\\ud83d\\ude00"):
        body = '{"model": "m1", "max_tokens": 2, "messages": [{"role": "user", "content": "' + content + '"}]}'
        assert _post(app, "/v1/chat/completions", body).status_code == 200, content


def test_invalid_utf8_is_a_400(app: Served) -> None:
    raw = b'{"model": "m1", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}'  # a UTF-8 surrogate
    r = _post(app, "/v1/chat/completions", raw)
    assert "UTF-8" in _refused(r, None)["message"]


def test_the_error_renderer_never_fails() -> None:
    body = {"error": {"message": "model '\ud800' not found", "type": "x", "extra": object()}}
    parsed = json.loads(render(body))
    assert parsed["error"]["message"] == "model '\ud800' not found"
    assert parsed["error"]["extra"].startswith("<object")
