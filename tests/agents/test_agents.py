"""Real agent harnesses (npm's Claude Code and pi, installed by scripts/install_agents.sh) against a real
`gmlx serve` with real models, each in its non-interactive mode and bounded in time.

- pi, started through `gmlx launch` (which writes a max output that fits), answers on SmolLM2 with the
  clamp off.
- Claude Code on Gemma 3 270M (32k window) asks max_tokens 32000 beside a ~3k-token prompt: with the
  clamp on it answers; with it off it reports the overflow through its own "Prompt is too long"
  handling. The test model is a base model that never ends a turn, so its profile stops at a line break.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agents.harness import CRASH, client_bin, client_env, config_server, gmlx_launch, run
from tests.conftest import gemma_path
from tests.e2e.server import ROOT, LiveServer, gmlx_serve

pytestmark = pytest.mark.slow


def test_pi_through_gmlx_launch_answers_on_smollm2_with_the_clamp_off(tmp_path: Path) -> None:
    client_bin("pi")
    work = tmp_path / "work"
    work.mkdir()
    with gmlx_serve([], tmp_path) as server:
        env = client_env(tmp_path / "home")
        cmd = gmlx_launch("pi", "smollm2", server.base_url, "--no-session", "-p", "Say hi in one short sentence.")
        proc = run(cmd, env, work)
        log = server.log()
    assert proc.returncode == 0, proc.stderr + log[-3000:]
    assert "max output 2048 tokens" in proc.stderr  # a quarter of SmolLM2's 8192-token window
    assert proc.stdout.strip() and not CRASH.search(proc.stdout + proc.stderr)
    assert '"POST /v1/chat/completions HTTP/1.1" 200' in log and "clamped" not in log
    assert (tmp_path / "home" / ".pi" / "agent" / "models.json").is_file()


@pytest.fixture(scope="module")
def gemma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One Gemma GGUF under two ids: `gemma` with the clamp on, `gemma-strict` with the oversized-max_tokens 400."""
    with config_server(
        tmp_path_factory.mktemp("gemma"),
        "server: {decode_batch: 1}\n"
        "models:\n"
        f"  gemma: {{path: {gemma_path()}, profile: oneline, clamp_max_tokens: true}}\n"
        f"  gemma-strict: {{path: {gemma_path()}, profile: oneline}}\n"
        "profiles:\n"
        '  oneline: {stop: ["\\n"], seed: 1}\n') as server:
        yield server


def claude(server: LiveServer, model: str, home: Path) -> subprocess.CompletedProcess[str]:
    work = home / "work"
    work.mkdir(parents=True)
    env = client_env(home, ANTHROPIC_BASE_URL=server.base_url, ANTHROPIC_API_KEY="gmlx-test")
    return run([str(client_bin("claude")), "-p", "say hi", "--model", model], env, work)


def test_claude_code_answers_on_gemma_with_the_clamp_on(gemma_server: LiveServer, tmp_path: Path) -> None:
    proc = claude(gemma_server, "gemma", tmp_path)
    log = gemma_server.log()
    assert proc.returncode == 0, proc.stdout + proc.stderr + log[-3000:]
    assert proc.stdout.strip() and not CRASH.search(proc.stdout + proc.stderr)
    clamp = re.search(r"max_tokens 32000 clamped to (\d+) \((\d+) prompt tokens, context window 32768", log)
    assert clamp is not None, log[-3000:]
    assert int(clamp.group(1)) + int(clamp.group(2)) == 32768 and int(clamp.group(2)) > 1000
    assert '"POST /v1/messages?beta=true HTTP/1.1" 200' in log


def test_claude_code_reports_the_overflow_itself_with_the_clamp_off(gemma_server: LiveServer,
                                                                    tmp_path: Path) -> None:
    proc = claude(gemma_server, "gemma-strict", tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Prompt is too long" in out, out  # Claude Code's own wording
    assert not CRASH.search(out)
    assert '"POST /v1/messages?beta=true HTTP/1.1" 400' in gemma_server.log()


def test_the_clients_are_the_pinned_versions() -> None:
    for name, version in (("claude", "2.1.197"), ("pi", "0.73.1"), ("opencode", "1.18.33"), ("codex", "0.171.0")):
        out = subprocess.run([str(client_bin(name)), "--version"], capture_output=True, text=True, timeout=60,
                             cwd=ROOT, env=client_env(Path("/nonexistent")))
        assert version in out.stdout + out.stderr
