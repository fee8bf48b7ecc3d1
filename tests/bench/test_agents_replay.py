"""The captured agent sessions (tests/data/agents) and bench/agents.py, which replays them.

The fast tests read the captures and the bench's request and stream handling, with no model; the slow
one replays the first two turns of the pi session against real servers.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.agents import CAPTURES, Turn, _first_output, _usage, load_session, replay_body, server_config, table
from tests.agents.pack import GENERATION_PATHS, reply_usage

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = sorted(CAPTURES.glob("*-session.json"))


def _blocks(content: Any) -> list[dict[str, Any]]:
    """Message content as blocks without cache_control: clients move their cache marker to the newest
    turn and may send an earlier turn's text as a string, which renders the same."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [{k: v for k, v in b.items() if k != "cache_control"} for b in content or []]


def _normal(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**m, "content": _blocks(m.get("content"))} for m in messages]


def test_both_clients_are_captured() -> None:
    assert {load_session(p)["client"]["name"] for p in SESSIONS} == {"pi", "claude"}


@pytest.mark.parametrize("path", SESSIONS, ids=lambda p: p.stem)
def test_capture_structure(path: Path) -> None:
    s = load_session(path)
    assert s["client"]["version"]
    model = s["model"]
    assert model["gguf"] in ("smollm2", "gemma")
    if "config" in model:  # the YAML the capture ran, with the GGUF left as a placeholder
        assert model["config"]["models"][model["id"]]["path"] == "{gguf}"
    reqs = s["requests"]
    assert len(reqs) >= 3 and len(s["prompts"]) == len(reqs)
    for i, r in enumerate(reqs):
        assert r["method"] == "POST" and r["path"].split("?")[0] in GENERATION_PATHS
        assert r["status"] == 200, r.get("error")
        assert not [k for k in r["headers"] if "key" in k or "auth" in k]
        body = r["body"]
        assert body["model"] == model["id"] and body["stream"] is True
        assert any(k in body for k in ("max_tokens", "max_completion_tokens"))
        # Claude Code sends its agent list as a system message after the first user turn.
        last = _blocks([m for m in body["messages"] if m["role"] == "user"][-1]["content"])
        assert s["prompts"][i] in last[-1]["text"]
        if r["path"].startswith("/v1/messages"):
            assert r["headers"]["anthropic-version"] and "anthropic-beta" in r["headers"]


@pytest.mark.parametrize("path", SESSIONS, ids=lambda p: p.stem)
def test_capture_conversation_grows(path: Path) -> None:
    """Each request is the previous one plus its answer and a new user turn, under the same system
    prompt and tools: the traffic a prompt cache is for."""
    reqs = [r["body"] for r in load_session(path)["requests"]]
    for prev, cur in itertools.pairwise(reqs):
        a, b = _normal(prev["messages"]), _normal(cur["messages"])
        assert b[: len(a)] == a and len(b) >= len(a) + 2
        assert b[len(a)]["role"] == "assistant"
        assert cur.get("tools") == prev.get("tools")
        assert _blocks(cur.get("system")) == _blocks(prev.get("system"))
    sizes = [len(json.dumps(r["messages"])) for r in reqs]
    assert sizes == sorted(sizes)


@pytest.mark.parametrize("path", SESSIONS, ids=lambda p: p.stem)
def test_capture_usage_grows(path: Path) -> None:
    """The live session's own usage (where its reply was kept whole): the prompt grows, and from the
    second turn the server reused the previous prompt."""
    rows = [(i, r["usage"]) for i, r in enumerate(load_session(path)["requests"]) if "usage" in r]
    assert len(rows) >= 3
    prompts = [u.get("prompt_tokens", u.get("input_tokens", 0) + u.get("cache_read_input_tokens", 0))
               for _, u in rows]
    assert prompts == sorted(prompts) and prompts[-1] > prompts[0]
    assert all(u.get("cached_tokens", u.get("cache_read_input_tokens")) > 0 for i, u in rows if i > 0)


def test_replay_body_streams_with_a_small_output_cap() -> None:
    chat = {"model": "m", "messages": [], "max_completion_tokens": 16384, "stream_options": {"x": 1}}
    out = replay_body(chat, "/v1/chat/completions", 8, None)
    assert out["max_completion_tokens"] == 8 and out["stream"] is True
    assert out["stream_options"] == {"x": 1, "include_usage": True}
    assert chat["max_completion_tokens"] == 16384  # the capture is not touched
    msg = replay_body({"model": "m", "max_tokens": 32000, "messages": []}, "/v1/messages?beta=true", 4, "other")
    assert msg["max_tokens"] == 4 and msg["model"] == "other" and "stream_options" not in msg
    assert replay_body({"model": "m", "messages": []}, "/v1/messages", 4, None)["max_tokens"] == 4


def test_stream_events_give_ttft_and_usage() -> None:
    assert not _first_output({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
    assert _first_output({"choices": [{"delta": {"content": "Hi"}}]})
    assert _first_output({"choices": [{"delta": {}, "finish_reason": "length"}]})
    assert not _first_output({"type": "message_start", "message": {}})
    assert _first_output({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "x"}})
    t = Turn(200, 1.0, 0, 0)
    _usage({"choices": [], "usage": {"prompt_tokens": 900, "prompt_tokens_details": {"cached_tokens": 649}}}, t)
    assert (t.prompt_tokens, t.cached_tokens) == (900, 649)
    _usage({"type": "message_delta", "usage": {"input_tokens": 225, "cache_read_input_tokens": 3082}}, t)
    assert (t.prompt_tokens, t.cached_tokens) == (3307, 3082)
    _usage({"type": "message_start", "message": {"usage": {"input_tokens": 1}}}, t)  # only the final counts
    assert t.prompt_tokens == 3307


def test_pack_reads_the_last_usage_of_a_reply() -> None:
    sse = ('data: {"choices":[],"usage":null}\n\ndata: {"choices":[],"usage":{"prompt_tokens":9,'
           '"prompt_tokens_details":{"cached_tokens":4}}}\n\ndata: [DONE]\n')
    assert reply_usage(sse) == {"prompt_tokens": 9, "cached_tokens": 4}
    anthropic = ('event: message_delta\ndata: {"type":"message_delta","usage":{"input_tokens":3,'
                 '"cache_read_input_tokens":5}}\n')
    assert reply_usage(anthropic)["cache_read_input_tokens"] == 5
    assert reply_usage("data: {\"choices\": []") == {}  # cut short: no usage


def test_table_reports_turns_failures_and_a_summary() -> None:
    rows = [(Turn(200, 10.0, 600, 0), Turn(200, 10.0, 600, 0)), (Turn(200, 20.0, 900, 0), Turn(200, 5.0, 900, 600)),
            (Turn(400, float("nan"), 0, 0, "prompt is too long"), Turn(400, float("nan"), 0, 0, "x"))]
    lines = table(rows)
    assert lines[1].split() == ["0", "600", "0", "10.000", "10.000", "1.000"]
    assert lines[2].split() == ["1", "900", "600", "20.000", "5.000", "0.250"]
    assert lines[3].split()[:3] == ["2", "HTTP", "400/400:"] and "prompt is too long" in lines[3]
    assert lines[4] == ("total TTFT 30.000s off, 15.000s on (0.500); 600 of 1500 prompt tokens from the cache, "
                        "mean ratio over turns 1+ 0.250")


def test_server_config_fills_in_the_model(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    claude = load_session(CAPTURES / "claude-session.json")
    cfg = server_config(claude, str(gguf), None)
    assert cfg["models"]["gemma"]["path"] == str(gguf) and cfg["server"]["clamp_max_tokens"] is True
    assert claude["model"]["config"]["models"]["gemma"]["path"] == "{gguf}"  # the session is not touched
    pi = load_session(CAPTURES / "pi-session.json")
    assert server_config(pi, str(gguf), None) == {"models": {"smollm2": {"path": str(gguf)}}}
    own = tmp_path / "own.yaml"
    own.write_text("models: {x: {path: /m.gguf}}\n")
    assert server_config(pi, None, own) == {"models": {"x": {"path": "/m.gguf"}}}


@pytest.mark.slow
def test_bench_replays_two_pi_turns() -> None:
    """bench/agents.py end to end on the real model: two servers, two turns, the second one cached."""
    proc = subprocess.run([sys.executable, "bench/agents.py", str(CAPTURES / "pi-session.json"), "--turns", "2",
                           "--gen", "4"], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    head = lines.index(next(line for line in lines if line.split()[:1] == ["turn"]))
    first, second = (line.split() for line in lines[head + 1: head + 3])
    # the capture's first prompt with pi's tools written in (SmolLM2's template has no tool syntax), nothing
    # cached yet; the second turn reuses the whole first prompt
    assert first[:3] == ["0", "1463", "0"]
    assert second[:3] == ["1", "1722", "1463"]
    assert lines[head + 3].startswith("total TTFT")
