"""The harness matrix (issue 34): every `gmlx launch` client on every chat test model gets one "Say hi" turn
on the default set-up (the models as `gmlx serve` serves them, no test profile; launch's default sizing), on
the one server tests/agents/conftest.py starts. Each cell ends inside the run bound with an answer and no
crash, or launch refuses it up front, before it writes or runs anything, with a message that says why: a
base model nothing stops (Gemma 3 270M), or a client whose own prompt takes more than half the model's window
(Codex's 6.2K and Claude Code's 5.3K on SmolLM2's 8K; Claude Code's 18.7K on Qwen's 32K, whose tokenizer leaves
its tools just under the compaction line), naming the served models that fit.

What each answered cell's server log must show: every request answered 200 (a client that compacts and
retries on a 400 loops on it: opencode on SmolLM2 did, with launch's old 2048-token output), on the client's
own route, and no turn run to the window: each request's generated tokens within the cap launch printed, its
prompt plus output inside the window, and Codex's cap-less request within half of what its prompt leaves (the
server's default cap). On SmolLM2 the turn's largest prompt is the table's figure for the client, within a
tenth, so the table follows the pins.

One 400 is known and counted: pi compacts after every turn once its global compaction.reserveTokens (16384)
is over half the window, and on SmolLM2's 8K its summary request asks 0.8 x 16384 tokens, which the window
refuses; pi has answered by then and carries on. launch says so and how to lower it (pi has no per-model or
per-run setting for it, so launch does not write the user's global one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from gmlx_server.launch.sizing import (
    FIXED_PROMPT,
    context_window,
    ends_no_turn,
    fitting_max_output,
    models_that_fit,
)
from tests.agents.harness import CRASH, client_bin
from tests.agents.matrix import CLIENTS, MODELS, Cell, run_cell
from tests.e2e.server import LiveServer

pytestmark = pytest.mark.slow
ROUTE = {"claude": "/v1/messages", "codex": "/v1/responses", "opencode": "/v1/chat/completions",
         "pi": "/v1/chat/completions"}
CONFIG_FILES = {"claude": (), "codex": (".codex/config.toml", ".codex/gmlx.config.toml"),
                "opencode": (".config/opencode/opencode.json",), "pi": (".pi/agent/models.json",)}
REPAIRED = "merged consecutive same-role messages"  # Gemma's template only: ChatML takes any order
PI_SUMMARY = ("pi", "smollm2")
PI_NOTE = "pi's compaction.reserveTokens (16384) leaves this window no room"


@pytest.mark.parametrize(("client", "model"), [pytest.param(c, m, id=f"{c}-{m}") for c in CLIENTS for m in MODELS])
def test_one_turn_ends_with_an_answer_or_is_refused(agents_server: LiveServer, tmp_path: Path, client: str,
                                                    model: str) -> None:
    client_bin(client)
    cell = run_cell(agents_server, tmp_path, client, model)
    rows = httpx.get(agents_server.v1 + "/models", timeout=30).json()["data"]  # what launch read
    row = next(r for r in rows if r["id"] == model)
    if ends_no_turn(row):
        return assert_refused_up_front(cell, tmp_path, rows, f"'{model}' is a base model")
    window, fixed = context_window(row), FIXED_PROMPT[client].on(row)
    if fitting_max_output(window, fixed) is None:
        return assert_refused_up_front(cell, tmp_path, rows, "more than half the")
    out = cell.stdout + cell.stderr
    assert cell.returncode == 0, out + cell.log[-3000:]
    assert cell.stdout.strip() and not CRASH.search(out), out
    assert (PI_NOTE in cell.stderr) == ((client, model) == PI_SUMMARY), cell.stderr
    others = [line for line in cell.stderr.splitlines() if PI_NOTE not in line]
    assert not [line for line in others if "clamp" in line]  # no other advice: the clamp cannot help them
    assert cell.cap == fitting_max_output(window, fixed), cell.stderr
    assert_no_turn_runs_to_the_window(cell, window)
    if model == "smollm2":  # the table's unit: its figure for this client is the pinned version's prompt
        largest = max(int(r["prompt_tokens"]) for r in cell.requests if r["status"] == "200")
        assert abs(largest - fixed) <= fixed // 10, largest
    for name in CONFIG_FILES[client]:
        assert (tmp_path / "home" / name).is_file(), name
    assert REPAIRED not in cell.log


def assert_refused_up_front(cell: Cell, root: Path, rows: list[dict[str, Any]], why: str) -> None:
    """Exit 2 with launch's one line, naming the served models that fit (not this one), before anything ran."""
    assert cell.returncode == 2 and cell.refusal is not None, cell.stderr + cell.log[-3000:]
    fit = models_that_fit(rows, FIXED_PROMPT[cell.client])
    assert cell.model not in fit and why in cell.refusal, cell.refusal
    named = cell.refusal.partition("served models that fit: ")[2].split(";")[0]
    assert named == ", ".join(fit) and (fit or "no served" in cell.refusal), cell.refusal
    assert not cell.requests and not (root / "home").exists()  # refused before it wrote or ran anything


def assert_no_turn_runs_to_the_window(cell: Cell, window: int) -> None:
    assert cell.cap is not None
    requests = cell.requests
    assert requests, cell.log[-3000:]
    refused = [r for r in requests if r["status"] != "200"]
    assert len(refused) == ((cell.client, cell.model) == PI_SUMMARY), refused  # so no loop of 400s
    assert all(r["code"] == "context_length_exceeded" and r["max_tokens"] == "13107" for r in refused), refused
    for r in (r for r in requests if r["status"] == "200"):
        assert r["route"] == ROUTE[cell.client], r
        generated, prompt = int(r["generated_tokens"]), int(r["prompt_tokens"])
        assert generated <= cell.cap and prompt + generated < window, r
        assert "clamp" not in r, r
        if cell.client == "codex":  # no cap of its own: the server's default leaves the conversation half the room
            assert prompt + 2 * generated <= window, r
