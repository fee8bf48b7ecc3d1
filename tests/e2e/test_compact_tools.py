"""Claude Code's 24 tools on the README's quick-start model (SmolLM2, an 8K window): written in full they take
about 20K tokens, more than the window. Past half the window (the model's tool_prompt_budget) they are rendered
compactly, so Claude Code's captured first request is answered, through the anthropic SDK on a real `gmlx serve`.
"""

from __future__ import annotations

import json
from typing import Any

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
