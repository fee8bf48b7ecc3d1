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
    assert (done["id"], done["model"], done["status"], done["finish"]) == (r.json()["id"], "smollm2", 200, "length")
    assert done["prompt_tokens"] == r.json()["usage"]["prompt_tokens"] and done["generated_tokens"] == 4
    assert isinstance(done["duration_s"], float) and done["message"].startswith("request id=")
    assert (refused["route"], refused["status"], refused["error"], refused["model"]) == (
        "/v1/messages", 404, "model_not_found", "nope")  # gmlx's own type, whichever protocol
    assert SECRET not in server.log()
