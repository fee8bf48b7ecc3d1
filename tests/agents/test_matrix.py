"""The harness matrix (issue 34): every `gmlx launch` client on every chat test model gets one "Say hi" turn
with launch's default sizing, on the one server tests/agents/conftest.py starts, and must end inside the
run bound with an answer and no crash.

What each cell's server log must show: every request answered 200 (a client that compacts and retries on a
400 loops on it: opencode on SmolLM2 did, with launch's old 2048-token output), on the client's own route,
and no turn run to the window: each request's generated tokens within the cap launch printed, and its
prompt plus output inside the window. Launch's cap is the one `gmlx_server/launch/sizing.py` computes
beside the client's fixed prompt, and launch advises no switch (the clamp) that cannot help. On SmolLM2 the
turn's largest prompt is the table's figure for the client, within a tenth, so the table follows the pins.

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

from gmlx_server.launch.sizing import FIXED_PROMPT, context_window, fitting_max_output
from tests.agents.harness import CRASH, client_bin
from tests.agents.matrix import CLIENTS, MODELS, Cell, run_cell
from tests.e2e.server import LiveServer

pytestmark = pytest.mark.slow
ROUTE = {"claude": "/v1/messages", "codex": "/v1/responses", "opencode": "/v1/chat/completions",
         "pi": "/v1/chat/completions"}
CONFIG_FILES = {"claude": (), "codex": (".codex/config.toml", ".codex/gmlx.config.toml"),
                "opencode": (".config/opencode/opencode.json",), "pi": (".pi/agent/models.json",)}
REPAIRED = "merged consecutive same-role messages"
REPAIRS = {("codex", "gemma"), ("opencode", "gemma")}  # developer, developer, user, user; system, user, user
PI_SUMMARY = ("pi", "smollm2")
PI_NOTE = "pi's compaction.reserveTokens (16384) leaves this window no room"


def row_of(server: LiveServer, model: str) -> dict[str, Any]:
    rows = httpx.get(server.v1 + "/models", timeout=30).json()["data"]
    return next(r for r in rows if r["id"] == model)


@pytest.mark.parametrize(("client", "model"), [pytest.param(c, m, id=f"{c}-{m}") for c in CLIENTS for m in MODELS])
def test_one_turn_ends_with_an_answer(agents_server: LiveServer, tmp_path: Path, client: str, model: str) -> None:
    client_bin(client)
    cell = run_cell(agents_server, tmp_path, client, model)
    out = cell.stdout + cell.stderr
    assert cell.returncode == 0, out + cell.log[-3000:]
    assert cell.stdout.strip() and not CRASH.search(out), out
    assert (PI_NOTE in cell.stderr) == ((client, model) == PI_SUMMARY), cell.stderr
    others = [line for line in cell.stderr.splitlines() if PI_NOTE not in line]
    assert not [line for line in others if "clamp" in line]  # no other advice: the clamp cannot help them
    row = row_of(agents_server, model)
    window, fixed = context_window(row), FIXED_PROMPT[client].on(row)
    assert cell.cap == fitting_max_output(window, fixed), cell.stderr
    assert_no_turn_runs_to_the_window(cell, window)
    if model == "smollm2":  # the table's unit: its figure for this client is the pinned version's prompt
        largest = max(int(r["prompt_tokens"]) for r in cell.requests if r["status"] == "200")
        assert abs(largest - fixed) <= fixed // 10, largest
    for name in CONFIG_FILES[client]:
        assert (tmp_path / "home" / name).is_file(), name
    if client in ("codex", "opencode"):
        assert (REPAIRED in cell.log) == ((client, model) in REPAIRS)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_base_model_nothing_stops_is_refused_up_front(agents_server: LiveServer, tmp_path: Path,
                                                        client: str) -> None:
    client_bin(client)
    cell = run_cell(agents_server, tmp_path, client, "gemma-base")
    assert cell.returncode == 2 and cell.refusal is not None, cell.stderr
    assert cell.refusal.startswith("'gemma-base' is a base model") and "served models that fit: " in cell.refusal
    assert "gemma-base" not in cell.refusal.partition("served models that fit: ")[2].split(", ")
    assert not cell.requests and not (tmp_path / "home").exists()  # refused before it wrote or ran anything


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
