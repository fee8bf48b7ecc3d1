"""`GMLX_LOG_FORMAT=json` on a real `gmlx serve`: every log line, uvicorn's too, is one JSON object, and the
request line carries its fields as typed keys (and no prompt text)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.server import LiveServer, gmlx_serve

pytestmark = pytest.mark.slow
SECRET = "Say the word lighthouse."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with gmlx_serve([], tmp_path_factory.mktemp("jsonlog"), env={"GMLX_LOG_FORMAT": "json"}) as s:
        yield s


def test_every_line_is_json_and_the_request_line_has_typed_fields(server: LiveServer) -> None:
    r = httpx.post(server.v1 + "/chat/completions", timeout=300, json={
        "model": "smollm2", "max_tokens": 4, "messages": [{"role": "user", "content": SECRET}]})
    assert r.status_code == 200
    assert httpx.post(server.v1 + "/messages", timeout=60, json={
        "model": "nope", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}).status_code == 404
    logged: list[dict[str, Any]] = [json.loads(line) for line in server.log().splitlines() if line.strip()]
    assert any(e["logger"].startswith("uvicorn") for e in logged)
    done, refused = (e for e in logged if e["logger"] == "gmlx.request")
    body = r.json()  # a short answer may stop before the cap: the line must say what the reply said
    assert (done["id"], done["model"], done["status"], done["finish"]) == (
        body["id"], "smollm2", 200, body["choices"][0]["finish_reason"])
    assert (done["prompt_tokens"], done["generated_tokens"]) == (
        body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"])
    assert 1 <= done["generated_tokens"] <= 4
    assert isinstance(done["duration_s"], float) and done["message"].startswith("request id=")
    assert (refused["route"], refused["status"], refused["error"], refused["model"]) == (
        "/v1/messages", 404, "model_not_found", "nope")  # gmlx's own type, whichever protocol
    assert SECRET not in server.log()
