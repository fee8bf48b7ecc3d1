"""Claude Code started by hand, without `gmlx launch` (test_matrix.py runs every client through it), on the
agents directory's one server: on Gemma 3 270M (32k window) it asks max_tokens 32000 beside its ~5K-token
prompt (its tools rendered compactly): with the clamp on (`gemma-clamp`) it answers; with it off (`gemma`)
it reports the overflow through its own "Prompt is too long" handling. And the clients are the pinned
versions.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.agents.harness import CRASH, client_bin, client_env, run
from tests.agents.matrix import QUESTION
from tests.e2e.server import ROOT, LiveServer

pytestmark = pytest.mark.slow


def claude(server: LiveServer, model: str, home: Path) -> subprocess.CompletedProcess[str]:
    work = home / "work"
    work.mkdir(parents=True)
    env = client_env(home, ANTHROPIC_BASE_URL=server.base_url, ANTHROPIC_API_KEY="gmlx-test")
    return run([str(client_bin("claude")), "-p", QUESTION, "--model", model], env, work)


def test_claude_code_answers_on_gemma_with_the_clamp_on(agents_server: LiveServer, tmp_path: Path) -> None:
    before = len(agents_server.log())
    proc = claude(agents_server, "gemma-clamp", tmp_path)
    log = agents_server.log()[before:]
    assert proc.returncode == 0, proc.stdout + proc.stderr + log[-3000:]
    assert proc.stdout.strip() and not CRASH.search(proc.stdout + proc.stderr)
    clamp = re.search(r"max_tokens 32000 clamped to (\d+) \((\d+) prompt tokens, context window 32768", log)
    assert clamp is not None, log[-3000:]
    assert int(clamp.group(1)) + int(clamp.group(2)) == 32768 and int(clamp.group(2)) > 1000
    assert '"POST /v1/messages?beta=true HTTP/1.1" 200' in log


def test_claude_code_reports_the_overflow_itself_with_the_clamp_off(agents_server: LiveServer,
                                                                    tmp_path: Path) -> None:
    before = len(agents_server.log())
    proc = claude(agents_server, "gemma", tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Prompt is too long" in out, out  # Claude Code's own wording
    assert not CRASH.search(out)
    assert '"POST /v1/messages?beta=true HTTP/1.1" 400' in agents_server.log()[before:]


def test_the_clients_are_the_pinned_versions() -> None:
    for name, version in (("claude", "2.1.197"), ("pi", "0.73.1"), ("opencode", "1.18.33"), ("codex", "0.171.0")):
        out = subprocess.run([str(client_bin(name)), "--version"], capture_output=True, text=True, timeout=60,
                             cwd=ROOT, env=client_env(Path("/nonexistent")))
        assert version in out.stdout + out.stderr
