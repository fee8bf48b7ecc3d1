"""Claude Code's 24 tools on the README's quick-start model (SmolLM2, an 8K window): written in full they take
about 20K tokens, more than the window. Past half the window (the model's tool_prompt_budget) they are rendered
compactly, so Claude Code's captured first request is answered, through the anthropic SDK on a real `gmlx serve`.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.e2e.server import ROOT, LiveServer, anthropic_client

pytestmark = pytest.mark.slow
SESSION = json.loads((ROOT / "tests/data/agents/claude-session.json").read_text())


@pytest.fixture(scope="module")
def server(default_server: LiveServer) -> LiveServer:
    return default_server


def test_claude_codes_tools_fit_the_small_window(server: LiveServer) -> None:
    body: dict[str, Any] = dict(SESSION["requests"][0]["body"])
    assert len(body["tools"]) == 24
    claude = anthropic_client(server)
    keep = {k: body[k] for k in ("system", "messages", "tools")}
    count = claude.messages.count_tokens(model="smollm2", **keep).input_tokens
    assert count < 8192 * 0.75  # the whole prompt, tools compact, fits with room to answer
    msg = claude.messages.create(model="smollm2", max_tokens=16, extra_body={"temperature": 0}, **keep)
    assert msg.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) == count
    line = next(x for x in server.log().splitlines() if "rendered compactly" in x)
    full = int(line.split(" tokens in full")[0].rsplit(" ", 1)[1])
    assert full > 8192 > count, line  # in full the tools alone overflow the window


CODES = [f"zq{i}" for i in range(1, 10)]  # nine: past the eight enum values a compact rendering keeps
PICK = {"name": "pick_code", "description": "Pick a code. Each code means something else.", "input_schema": {
    "type": "object", "required": ["code"], "additionalProperties": False,
    "properties": {"code": {"type": "string", "enum": CODES, "description": "The code to pick."}}}}


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": tool["name"], "description": tool.get("description", ""),
                                             "parameters": tool["input_schema"]}}


def test_a_compact_prompt_is_counted_alike_and_leaves_the_grammar_the_full_schema(server: LiveServer) -> None:
    """/apply-template, /tokenize and /v1/estimate render the tools as a generation does (compactly here: they
    once rendered them in full, 17K tokens against count_tokens' 2K), and the prompt shows pick_code's parameter
    without its enum while a named call is still held to one of the codes."""
    tools = [*SESSION["requests"][0]["body"]["tools"], PICK]
    ask = [{"role": "user", "content": "Pick a code."}]
    body = {"model": "smollm2", "messages": [{"role": "system", "content": "You are Claude Code."}, *ask],
            "tools": [_function(t) for t in tools]}
    prompt = httpx.post(server.base_url + "/apply-template", json=body, timeout=120).json()["prompt"]
    assert "pick_code" in prompt and "zq1" not in prompt  # compact: the enum is not in the prompt
    counts = [httpx.post(server.base_url + "/tokenize", json=body, timeout=120).json()["count"],
              httpx.post(server.v1 + "/estimate", json=body, timeout=120).json()["prompt_tokens"]]
    claude = anthropic_client(server)
    counted = claude.messages.count_tokens(model="smollm2", system="You are Claude Code.", messages=ask,  # type: ignore[arg-type]
                                           tools=tools).input_tokens
    assert counts == [counted, counted] and counted < 8192 / 2, (counts, counted)
    msg = claude.messages.create(model="smollm2", max_tokens=48, tools=tools, system="You are Claude Code.",
                                 messages=ask, tool_choice={"type": "tool", "name": "pick_code"},  # type: ignore[arg-type]
                                 extra_body={"temperature": 0})
    [call] = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and call.name == "pick_code", msg
    assert call.input in [{"code": c} for c in CODES], call.input  # the full schema: one of the nine, nothing else
