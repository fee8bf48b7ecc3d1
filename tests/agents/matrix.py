"""The harness matrix: every `gmlx launch` client on every chat test model, one "Say hi" turn each, with
launch's default sizing, against one `gmlx serve` that serves the models as it does by default (no profile,
each family's sampling). tests/agents/test_matrix.py asserts each cell; `bench/agents.py --matrix` prints its times.

A cell's outcome is read from the client (exit status, answer, launch's own lines) and from the server's
request log lines the turn wrote (status, prompt and generated tokens, TTFT), so the same run serves both.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.agents.harness import RUN_S, client_env, gmlx_launch, run
from tests.e2e.server import LiveServer

QUESTION = "Say hi in one short sentence."
CLIENTS = ("claude", "codex", "opencode", "pi")
MODELS = ("smollm2", "qwen", "gemma-base")  # Gemma 3 270M as served by default: a base model, refused
# Each client's non-interactive one-turn form, after launch's own options.
TURN_ARGS = {"claude": ["-p", QUESTION], "codex": ["exec", "--skip-git-repo-check", QUESTION],
             "opencode": ["run", QUESTION], "pi": ["--no-session", "-p", QUESTION]}
# The cap each client is given, as launch prints it (Codex's is the room its auto-compact limit leaves).
CAP_NOTE = {"claude": r"max output (\d+) tokens", "pi": r"max output (\d+) tokens",
            "opencode": r"output (\d+) tokens", "codex": r"context window (\d+), auto-compact at (\d+) tokens"}
_FIELD = re.compile(r'(\w+)=("[^"]*"|\S+)')


def matrix_config(paths: Mapping[str, str]) -> str:
    """The server's YAML. The matrix's models are served as `gmlx serve` serves a GGUF: no profile, no
    sampling, stop or budget of the tests' own, so the cells meet what a user meets. `gemma` (a profile that
    stops the base model at a line break) and `gemma-clamp` (the same with the clamp on) are for test_agents.py,
    which starts Claude Code by hand."""
    return ("models:\n"
            f"  smollm2: {{path: {paths['smollm2']}}}\n"
            f"  qwen: {{path: {paths['qwen']}}}\n"
            f"  gemma-base: {{path: {paths['gemma']}}}\n"
            f"  gemma: {{path: {paths['gemma']}, profile: oneline}}\n"
            f"  gemma-clamp: {{path: {paths['gemma']}, profile: oneline, clamp_max_tokens: true}}\n"
            "profiles:\n"
            '  oneline: {stop: ["\\n", "."], max_tokens: 64, seed: 1}\n')


@dataclass
class Cell:
    client: str
    model: str
    returncode: int
    stdout: str
    stderr: str
    log: str  # what the server logged during the turn
    wall_s: float

    @property
    def requests(self) -> list[dict[str, str]]:
        """The turn's request log lines (`gmlx.request`) on its model, as fields (a line the previous cell's
        cancelled request writes late is another model's, or has no generation of this turn)."""
        lines = (dict((k, v.strip('"')) for k, v in _FIELD.findall(line.split(" request ", 1)[1]))
                 for line in self.log.splitlines() if " request id=" in line)
        return [r for r in lines if r.get("model") == self.model]

    @property
    def cap(self) -> int | None:
        """The output cap launch gave the client (from its own line), None when it printed none."""
        m = re.search(CAP_NOTE[self.client], self.stderr)
        if m is None:
            return None
        return int(m.group(1)) - int(m.group(2)) if self.client == "codex" else int(m.group(1))

    @property
    def refusal(self) -> str | None:
        """launch's one-line refusal, printed before it wrote or started anything; None when it ran the client."""
        first = (self.stderr.strip().splitlines() or [""])[0]
        ran = first.startswith((f"gmlx launch: {self.client} ", "gmlx launch: wrote "))
        return first.removeprefix("gmlx launch: ") if first.startswith("gmlx launch: ") and not ran else None


def run_cell(server: LiveServer, root: Path, client: str, model: str) -> Cell:
    """One turn of `client` on `model` through gmlx launch, in a fresh home and work directory under root."""
    home, work = root / "home", root / "work"
    work.mkdir(parents=True, exist_ok=True)
    wait_idle(server)
    before = len(server.log())
    t0 = time.perf_counter()
    try:
        proc = run(gmlx_launch(client, model, server.base_url, *TURN_ARGS[client]), client_env(home), work)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = 124, _text(e.stdout), _text(e.stderr) + f"\n(no end after {e.timeout} s)"
    return Cell(client, model, rc, out, err, server.log()[before:], time.perf_counter() - t0)


def wait_idle(server: LiveServer, bound_s: float = RUN_S) -> None:
    """Until no request runs: a client killed at the bound leaves its request running for a while, and a cell
    must not share the machine with the previous one's."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline and httpx.get(server.v1 + "/metrics", timeout=30).json()["server"]["requests"]:
        time.sleep(2)


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""
