"""The tool loop over the scripted fake engine, on a real uvicorn, with the test MCP server over stdio and
streamable HTTP: each protocol through its official SDK, the edge cases (a disallowed tool, a failing tool, a
timeout, a dead server, the step limit), what /v1/models, /v1/metrics and Prometheus show, and refusals."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gmlx_server.engine.types import EngineStats, RequestRow
from tests.assistants.conftest import HELPER_TOOLS, KEY, Live, config_text
from tests.assistants.tools_server import calls, started_pids

ANSWER = "Answer: The capital of Zubrowka is Lutz."


def ask(live: Live, text: str, model: str = "helper", **body: Any) -> httpx.Response:
    payload = {"model": model, "messages": [{"role": "user", "content": text}], **body}
    return httpx.post(f"{live.url}/v1/chat/completions", json=payload, headers=live.headers, timeout=60)


def oai(live: Live) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key=KEY, max_retries=0)


def metrics(live: Live) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{live.url}/v1/metrics", headers=live.headers).json()
    return body["server"]


# --- the answer, on every protocol ----------------------------------------------------------------

def test_chat_runs_the_allowlisted_tool_and_answers_with_its_result(live: Live) -> None:
    before = len(calls(live.call_log))
    done = oai(live).chat.completions.create(model="helper", messages=[{"role": "user", "content": "capital?"}])
    assert done.model == "helper" and done.choices[0].finish_reason == "stop"
    assert done.choices[0].message.content == ANSWER
    [step] = (done.model_extra or {})["tool_trace"]
    assert step["tool"] == "lookup_capital" and step["server"] == "caps" and step["ok"] is True
    assert step["arguments"] == {"country": "Zubrowka"} and step["result"] == "The capital of Zubrowka is Lutz."
    assert calls(live.call_log)[before:] == [{"pid": started_pids(live.call_log)[-1], "tool": "lookup_capital",
                                              "arguments": {"country": "Zubrowka"}}]


def test_chat_stream_shows_each_call_then_streams_the_answer(live: Live) -> None:
    chunks = list(oai(live).chat.completions.create(
        model="helper", messages=[{"role": "user", "content": "capital?"}], stream=True))
    traced = [i for i, c in enumerate(chunks) if (c.model_extra or {}).get("tool_trace")]
    texts = [i for i, c in enumerate(chunks) if c.choices and c.choices[0].delta.content]
    assert len(traced) == 1 and traced[0] < texts[0] and len(texts) > 3  # the answer streams, in pieces
    assert "".join(chunks[i].choices[0].delta.content or "" for i in texts) == ANSWER
    with oai(live).chat.completions.stream(model="helper", messages=[{"role": "user", "content": "capital?"}]) as s:
        final = s.get_final_completion()  # the SDK's own accumulator passes the trace chunks by
    assert final.choices[0].message.content == ANSWER


def test_anthropic_messages_streamed_and_not(live: Live) -> None:
    client = anthropic.Anthropic(base_url=live.url, api_key=KEY, max_retries=0)
    msg = client.messages.create(model="helper", max_tokens=200, messages=[{"role": "user", "content": "capital?"}])
    assert msg.content[0].type == "text" and msg.content[0].text == ANSWER
    assert msg.stop_reason == "end_turn" and (msg.model_extra or {})["tool_trace"][0]["tool"] == "lookup_capital"
    with client.messages.stream(model="helper", max_tokens=200,
                                messages=[{"role": "user", "content": "capital?"}]) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert "tool_trace" in kinds and kinds.index("tool_trace") < kinds.index("text")
    assert [b.type for b in final.content] == ["text"] and "Lutz" in final.content[0].text  # type: ignore[union-attr]


def test_responses_streamed_and_not(live: Live) -> None:
    client = oai(live)
    done = client.responses.create(model="helper", input="capital?")
    assert done.output_text == ANSWER
    assert (done.model_extra or {})["tool_trace"][0]["result"] == "The capital of Zubrowka is Lutz."
    events = list(client.responses.create(model="helper", input="capital?", stream=True))
    kinds = [e.type for e in events]
    assert kinds.index("response.tool_trace") < kinds.index("response.output_text.delta")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert (events[-1].response.model_extra or {})["tool_trace"][0]["ok"] is True  # type: ignore[union-attr]
    with client.responses.stream(model="helper", input="capital?") as s:
        assert s.get_final_response().output_text == ANSWER


def test_a_streamable_http_server_serves_its_assistant(live: Live) -> None:
    done = ask(live, "capital?", model="webby").json()
    assert done["choices"][0]["message"]["content"] == ANSWER
    assert done["tool_trace"][0]["server"] == "web"
    assert calls(live.http_log)[-1]["arguments"] == {"country": "Zubrowka"}


# --- edge cases -------------------------------------------------------------------------------------

def test_a_disallowed_tool_never_reaches_the_server(live: Live) -> None:
    """`add` is one of the server's tools, but not on helper's allowlist: the model gets an error naming the
    allowed tools, and the server's own call log shows no call."""
    before = calls(live.call_log)
    body = ask(live, "disallowed").json()
    [step] = body["tool_trace"]
    assert step["ok"] is False and step["server"] is None and step["error"]["type"] == "tool_not_allowed"
    assert "lookup_capital, fail_always, sleep_forever" in step["error"]["message"]
    assert "tool_not_allowed" in body["choices"][0]["message"]["content"]  # the model read the typed result
    assert calls(live.call_log) == before
    assert not [c for c in calls(live.call_log) if c["tool"] == "add"]


def test_a_failing_tool_is_a_typed_result(live: Live) -> None:
    r = ask(live, "failing")
    assert r.status_code == 200
    [step] = r.json()["tool_trace"]
    assert step["error"]["type"] == "tool_error" and "fail_always" in step["error"]["message"]
    assert calls(live.call_log)[-1]["tool"] == "fail_always"


def test_a_tool_that_never_answers_times_out(live: Live) -> None:
    r = ask(live, "sleepy")
    assert r.status_code == 200
    [step] = r.json()["tool_trace"]
    assert step["error"] == {"type": "tool_timeout", "message": "sleep_forever did not answer within 1.5 s"}
    assert step["duration_s"] >= 1.5 and calls(live.call_log)[-1]["tool"] == "sleep_forever"


def test_the_step_limit_ends_the_answer_and_says_so(live: Live) -> None:
    before = len(calls(live.call_log))
    body = ask(live, "forever").json()
    steps = body["tool_trace"]
    assert [s["ok"] for s in steps] == [True, True, False] and steps[2]["error"]["type"] == "step_limit"
    text = body["choices"][0]["message"]["content"]
    assert text.endswith("[stopped: assistant 'helper' reached its limit of 2 tool steps; the model's last calls "
                         "were not run: lookup_capital]")
    assert len(calls(live.call_log)) - before == 2  # the third call was never sent


def test_a_dead_server_is_restarted(live: Live) -> None:
    pid = started_pids(live.call_log)[-1]
    os.kill(pid, signal.SIGKILL)
    r = ask(live, "capital?")  # while it is down (or just back): a typed result, never a 500
    step = r.json()["tool_trace"][0]
    assert r.status_code == 200 and (step["ok"] or step["error"]["type"] == "tool_unavailable")
    deadline = time.monotonic() + 60
    while (caps := metrics(live)["assistants"]["helper"]["servers"]["caps"])["state"] != "ready" or not caps[
            "restarts"]:
        assert time.monotonic() < deadline, caps
        time.sleep(0.1)
    body = ask(live, "twice").json()
    assert [s["ok"] for s in body["tool_trace"]] == [True, True] and "Fredville" in body["choices"][0]["message"][
        "content"]
    new = started_pids(live.call_log)[-1]
    assert new != pid and calls(live.call_log)[-1]["pid"] == new
    assert f"mcp helper/caps: gmlx-test-tools {new} starting" in live.mcp_log.lines  # its stderr, tagged


# --- what operators see -------------------------------------------------------------------------------

def test_models_lists_the_assistants(live: Live) -> None:
    rows = {r["id"]: r for r in httpx.get(f"{live.url}/v1/models", headers=live.headers).json()["data"]}
    helper = rows["helper"]
    assert helper["kind"] == "assistant" and helper["assistant"] is True and helper["model"] == "m1"
    assert helper["tools"] == {"caps": ["lookup_capital", "fail_always", "sleep_forever"]}
    assert helper["max_steps"] == 2 and helper["context_length"] == rows["m1"]["context_length"]
    assert rows["webby"]["tools"] == {"web": ["lookup_capital"]}
    one = httpx.get(f"{live.url}/v1/models/helper", headers=live.headers).json()
    assert one["id"] == "helper" and one["assistant"] is True


def test_metrics_show_the_loop_step_and_the_tool_calls(live: Live) -> None:
    seen: list[dict[str, Any]] = []

    def watch() -> None:
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            active = metrics(live)["assistants"]["helper"]["active"]
            seen.extend(a for a in active if a["state"] == "tool")
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    ask(live, "sleepy")
    watcher.join()
    assert seen and seen[0]["step"] == 1 and seen[0]["tool"] == "sleep_forever" and seen[0]["max_steps"] == 2
    tools = metrics(live)["assistants"]["helper"]["tools"]
    assert tools["sleep_forever"]["outcomes"]["tool_timeout"] >= 1 and tools["lookup_capital"]["calls"] >= 1
    text = httpx.get(f"{live.url}/v1/metrics?format=prometheus", headers=live.headers).text
    assert 'gmlx_assistant_tool_calls_total{assistant="helper",outcome="tool_timeout",tool="sleep_forever"}' in text
    assert 'gmlx_assistant_mcp_up{assistant="webby",server="web"} 1.0' in text


def with_rows(engine: Any) -> None:
    """The fake engine's stats, with a decode row per running request (as the real engine reports them)."""
    def stats() -> EngineStats:
        rows = tuple(RequestRow(h.request_id, "decode", len(h.request.prompt_tokens), 0, h.request.max_tokens, 0.0,
                                None, None) for h in engine.running)
        return EngineStats(engine.decode_batch, len(rows), 0, rows)

    engine.stats = stats


def test_an_engine_row_names_its_assistant_and_step(live: Live) -> None:
    rows: list[dict[str, Any]] = []
    with_rows(live.factory.engines["m1"])
    live.factory.behavior.token_s = 0.05  # the answer turn decodes slowly enough to be seen

    def watch() -> None:
        deadline = time.monotonic() + 10
        while not rows and time.monotonic() < deadline:
            rows.extend(r for r in metrics(live)["requests"] if (r.get("assistant") or {}).get("step") == 2)
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        ask(live, "capital?")
    finally:
        live.factory.behavior.token_s = 0.0
        watcher.join()
    assert rows and rows[0]["assistant"]["assistant"] == "helper" and rows[0]["model"] == "m1"


def test_a_client_that_leaves_cancels_the_running_tool_call(live: Live) -> None:
    payload = {"model": "helper", "stream": True, "messages": [{"role": "user", "content": "sleepy"}]}
    active: list[dict[str, Any]] = []
    with httpx.stream("POST", f"{live.url}/v1/chat/completions", json=payload, headers=live.headers,
                      timeout=60) as r:
        lines = r.iter_lines()  # kept: a dropped iterator closes the connection
        next(lines)  # the stream has begun; the loop is in its tool call
        deadline = time.monotonic() + 10
        while not (active := metrics(live)["assistants"]["helper"]["active"]):
            assert time.monotonic() < deadline
            time.sleep(0.02)
    deadline = time.monotonic() + 10
    while metrics(live)["assistants"]["helper"]["active"]:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    turns = [q for q in live.factory.engines["m1"].submitted if q.request_id == active[0]["id"]]
    assert len(turns) == 1  # the loop ended with the client: the call was cancelled, no second turn began
    assert "Lutz" in ask(live, "capital?").json()["choices"][0]["message"]["content"]  # the server still serves


# --- refusals and the key -----------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "param"), [
    ({"tools": [{"type": "function", "function": {"name": "x", "parameters": {}}}]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"logprobs": True}, "logprobs"),
])
def test_what_an_assistant_cannot_honour_is_refused_by_name(live: Live, body: dict[str, Any], param: str) -> None:
    r = ask(live, "capital?", **body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_the_api_key_covers_assistant_ids(live: Live) -> None:
    r = httpx.post(f"{live.url}/v1/chat/completions", json={"model": "helper", "messages": []})
    assert r.status_code == 401


def test_unload_stops_the_servers_and_the_next_request_starts_them(live: Live) -> None:
    pid = started_pids(live.call_log)[-1]
    r = httpx.post(f"{live.url}/unload", json={"model": "helper"}, headers=live.headers)
    assert r.json()["unloaded"] == ["helper"]
    assert metrics(live)["assistants"]["helper"]["servers"]["caps"]["state"] == "stopped"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the process is gone, not just forgotten
    assert "Lutz" in ask(live, "capital?").json()["choices"][0]["message"]["content"]
    assert started_pids(live.call_log)[-1] != pid


# --- reload (last: it edits the module's config file, and puts it back) -------------------------------

def reload(live: Live, helper_tools: list[str]) -> httpx.Response:
    live.config_path.write_text(config_text(live.call_log, live.web_url, helper_tools))
    return httpx.post(f"{live.url}/v1/reload", headers=live.headers, timeout=60)


def test_a_reload_that_changes_an_allowlist_takes_effect_without_a_restart(live: Live) -> None:
    pid = started_pids(live.call_log)[-1]
    try:
        assert reload(live, [*HELPER_TOOLS, "add"]).json()["status"] == "reloaded"
        body = ask(live, "disallowed").json()  # the scenario calls add, which is now allowed
        assert body["tool_trace"][0]["ok"] is True and body["choices"][0]["message"]["content"] == "Answer: 3"
        assert calls(live.call_log)[-1] == {"pid": pid, "tool": "add", "arguments": {"a": 1, "b": 2}}
        rows = {r["id"]: r for r in httpx.get(f"{live.url}/v1/models", headers=live.headers).json()["data"]}
        assert rows["helper"]["tools"]["caps"][-1] == "add"
        bad = reload(live, ["lookup_capital", "nope"])  # checked against the server before anything changes
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "assistants.helper.tools.caps"
        assert "does not list 'nope'" in bad.json()["error"]["message"]
        assert ask(live, "disallowed").json()["tool_trace"][0]["ok"] is True  # the running config is kept
        assert started_pids(live.call_log)[-1] == pid  # one server process throughout: the link was kept
    finally:
        assert reload(live, HELPER_TOOLS).status_code == 200
    assert ask(live, "disallowed").json()["tool_trace"][0]["error"]["type"] == "tool_not_allowed"
