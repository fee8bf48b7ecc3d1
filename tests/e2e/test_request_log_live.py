"""The request log tells the whole story, on a real `gmlx serve` with SmolLM2: a client that leaves gets
finish=cancelled with its tokens and TTFT, a refusal its code and counts, a tool-call reply finish=tool_calls
and the parser that ran; the ignored-fields warning comes once per client and field set; / answers."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import smollm2_path
from tests.e2e.server import ROOT, LiveServer, gmlx_serve

pytestmark = pytest.mark.slow
CAPTURED = json.loads((ROOT / "tests/data/tool_outputs/smollm2_hermes_captured.json").read_text())
CASES = {c["name"]: c for c in CAPTURED["cases"]}
LONG = [{"role": "user", "content": "Count from one to one thousand in words, one number a line."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("reqlog")
    config = tmp / "gmlx.yaml"
    config.write_text(f"models:\n  smollm2:\n    path: {smollm2_path()}\n    tool_format: json\n"
                      f"  smollm2-hermes:\n    path: {smollm2_path()}\n"
                      f"    chat_template: {ROOT / 'tests/data/hermes_template.jinja'}\n")
    with gmlx_serve(["--config", str(config)], tmp) as s:
        yield s


def request_lines(server: LiveServer) -> list[dict[str, str]]:
    """Every `request k=v ...` line of the server's log, as its fields."""
    out = []
    for line in server.log().splitlines():
        _, found, rest = line.partition(" request id=")
        if found:
            out.append({k: json.loads(v) if v.startswith('"') else v
                        for k, v in re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', "id=" + rest)})
    return out


def line_of(server: LiveServer, request_id: str | None = None, timeout_s: float = 60.0,
            **match: str) -> dict[str, str]:
    """The request line with this id (or these field values), waiting for it to be written."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for f in request_lines(server):
            if (request_id is None or f.get("id") == request_id) and all(f.get(k) == v for k, v in match.items()):
                return f
        time.sleep(0.2)
    raise AssertionError(f"no request line {request_id} {match} in:\n{server.log()[-3000:]}")


def chat(server: LiveServer, body: dict[str, Any], timeout: float | httpx.Timeout = 300, **kw: Any) -> httpx.Response:
    return httpx.post(server.v1 + "/chat/completions", json={"model": "smollm2", **body}, timeout=timeout, **kw)


def test_a_streaming_client_that_leaves_is_logged_cancelled_with_tokens_and_ttft(server: LiveServer) -> None:
    with httpx.stream("POST", server.v1 + "/chat/completions", timeout=300, json={
            "model": "smollm2", "messages": LONG, "max_tokens": 4000, "stream": True, "temperature": 0}) as r:
        chunks = (json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {"))
        first = next(chunks)
        for _, _ in zip(range(5), chunks, strict=False):
            pass  # a few tokens, then leave
    f = line_of(server, first["id"])
    assert (f["status"], f["finish"]) == ("200", "cancelled")
    assert 5 <= int(f["generated_tokens"]) < 4000 and float(f["ttft_s"]) > 0 and int(f["prompt_tokens"]) > 0


def test_a_waiting_client_that_leaves_is_logged_cancelled(server: LiveServer) -> None:
    with pytest.raises(httpx.ReadTimeout):  # greedy counting runs on: the client gives up after 2 s
        httpx.post(server.v1 + "/completions", timeout=httpx.Timeout(300, read=2.0), json={
            "model": "smollm2", "prompt": "1, 2, 3, 4, 5,", "max_tokens": 4000, "temperature": 0, "user": "leaver"})
    f = line_of(server, finish="cancelled", status="499")
    assert f["error"] == "client_closed_request" and int(f["generated_tokens"]) > 0 and f["ttft_s"] != "-"
    assert f["ignored"] == "user"


def test_a_context_refusal_logs_its_code_and_counts(server: LiveServer) -> None:
    r = chat(server, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100_000})
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded"
    f = line_of(server, code="context_length_exceeded")
    assert (f["status"], f["error"], f["model"]) == ("400", "invalid_request_error", "smollm2")
    assert int(f["prompt_tokens"]) == err["prompt_tokens"] > 0 and f["max_tokens"] == "100000"
    assert int(f["context_budget"]) == err["context_budget"]


def test_tool_call_replies_log_tool_calls_and_the_parser_that_ran(server: LiveServer) -> None:
    hermes = chat(server, {"model": "smollm2-hermes", "messages": CASES["two_shot_paris_greedy"]["messages"],
                           "tools": CAPTURED["tools"], "temperature": 0, "max_tokens": 40}).json()
    assert hermes["choices"][0]["finish_reason"] == "tool_calls"
    f = line_of(server, hermes["id"])
    assert (f["finish"], f["tool_calls"], f["tool_parser"]) == ("tool_calls", "1", "hermes")
    own = chat(server, {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": CAPTURED["tools"],
                        "tool_choice": "required", "temperature": 0, "max_tokens": 60}).json()
    assert own["choices"][0]["finish_reason"] == "tool_calls"
    f = line_of(server, own["id"])
    assert (f["finish"], f["tool_parser"]) == ("tool_calls", "json")  # tool_format json: gmlx's own syntax
    assert "tool calls parsed as" not in server.log()


def test_ignored_fields_warn_once_per_client_and_field_set_and_are_counted(server: LiveServer) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "metadata": {"k": "v"},
            "user": "someone"}
    for agent in ("agent-a", "agent-a", "agent-a", "agent-b"):
        assert chat(server, body, headers={"User-Agent": agent}).status_code == 200
    assert chat(server, {**body, "n": 1}, headers={"User-Agent": "agent-a"}).status_code == 200
    warned = [ln for ln in server.log().splitlines() if "ignored parameters: user, metadata" in ln]
    assert len(warned) == 2  # agent-a once, agent-b once
    assert sum("ignored parameters: n, user, metadata" in ln for ln in server.log().splitlines()) == 1
    metrics = httpx.get(server.v1 + "/metrics", params={"format": "prometheus"}, timeout=30).text
    count = re.search(r'^gmlx_ignored_fields_total\{field="metadata"\} (\S+)$', metrics, re.M)
    assert count is not None and float(count.group(1)) >= 5


def test_root_answers_name_version_and_links(server: LiveServer) -> None:
    r = httpx.get(server.base_url + "/", timeout=30)
    body = r.json()
    assert r.status_code == 200 and body["name"] == "gmlx" and body["version"]
    assert httpx.get(server.base_url + body["links"]["models"], timeout=30).json()["data"]
    assert httpx.get(server.base_url + body["links"]["docs"], timeout=30).json()["openapi"].startswith("3.")
    head = httpx.head(server.base_url + "/", timeout=30)
    assert head.status_code == 200 and head.content == b""
