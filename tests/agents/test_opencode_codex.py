"""opencode and Codex CLI, each started through `gmlx launch` in its non-interactive mode (`opencode run`,
`codex exec`), answer a one-line question against a real `gmlx serve` on SmolLM2 (8k window) and Gemma 3
270M (32k).

Without launch's config opencode asks max_tokens 32000 (over both windows). On Gemma launch's output cap
(a quarter of the window) fits beside opencode's prompt, clamp off. On SmolLM2 it cannot: opencode's
system prompt and tools, written into the prompt by gmlx's tool convention, take 7.6K of the 8K tokens,
and launch sizes its output from that (286); `--max-output 256` fits too (and bounds its title request,
which SmolLM2 can ramble on).

Codex speaks only the Responses API and opens with developer, developer, user, user, which Gemma's
template refuses as sent; so does opencode's title request (system, user, user): the server's role repair
answers both. Codex sends no output cap, so each model's profile bounds the answer; Gemma 3 270M is a base
model that never ends a turn, so its profile also stops at the first line break or full stop: a sampled
Gemma answer once ran 48 tokens without a line break in CI, which Codex reports as an incomplete response.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gmlx_server.launch.sizing import FIXED_PROMPT, fitting_max_output
from tests.agents.harness import CRASH, client_bin, client_env, config_server, gmlx_launch, run
from tests.conftest import gemma_path, smollm2_path
from tests.e2e.server import LiveServer

pytestmark = pytest.mark.slow
QUESTION = "Say hi in one short sentence."
REPAIRED = "merged consecutive same-role messages"
WINDOWS = {"smollm2": 8192, "gemma": 32768}
OPENCODE_OUTPUT = {"smollm2": 256, "gemma": 32768 // 4}  # on SmolLM2 a quarter does not fit beside 7.6K


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with config_server(
        tmp_path_factory.mktemp("harnesses"),
        "server: {decode_batch: 1}\n"
        "models:\n"
        f"  smollm2: {{path: {smollm2_path()}, profile: short}}\n"
        f"  gemma: {{path: {gemma_path()}, profile: oneline}}\n"
        "profiles:\n"
        # Codex's prompt varies (date, paths): room for a longer reply, and greedy, since a sampled SmolLM2
        # answer could ramble past any cap, which Codex reports as an incomplete response (exit 1)
        "  short: {max_tokens: 96, temperature: 0}\n"
        '  oneline: {stop: ["\\n", "."], max_tokens: 64, seed: 1}\n') as s:
        yield s


def launched(server: LiveServer, tmp_path: Path, client: str, model: str, *args: str) -> tuple[str, str, str]:
    """Run the client through gmlx launch in a fresh home: (its stdout, its stderr, the server log it made)."""
    client_bin(client)
    work = tmp_path / "work"
    work.mkdir()
    before = len(server.log())
    proc = run(gmlx_launch(client, model, server.base_url, *args), client_env(tmp_path / "home"), work)
    log = server.log()[before:]
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out + log[-3000:]
    assert proc.stdout.strip() and not CRASH.search(out), out
    assert not re.search(r'" [45]\d\d ', log), log[-3000:]  # no request refused or failed on the way
    return proc.stdout, proc.stderr, log


@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_opencode_run_answers_through_gmlx_launch(server: LiveServer, tmp_path: Path, model: str) -> None:
    output = OPENCODE_OUTPUT[model]
    _, err, log = launched(server, tmp_path, "opencode", model, "--max-output", str(output), "run", QUESTION)
    assert f"context {WINDOWS[model]}, output {output} tokens" in err  # launch's limit, not opencode's 32000
    assert "clamp" not in err  # launch advises no switch that cannot help
    assert (tmp_path / "home" / ".config" / "opencode" / "opencode.json").is_file()
    assert '"POST /v1/chat/completions HTTP/1.1" 200' in log
    assert (REPAIRED in log) == (model == "gemma")  # the title request's order, repaired on Gemma only


@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_codex_exec_answers_through_gmlx_launch(server: LiveServer, tmp_path: Path, model: str) -> None:
    _, err, log = launched(server, tmp_path, "codex", model, "exec", "--skip-git-repo-check", QUESTION)
    window = WINDOWS[model]
    out = fitting_max_output(window, FIXED_PROMPT["codex"].at(window))  # beside Codex's own 6.2K-token prompt
    assert out is not None and f"context window {window}, auto-compact at {window - out} tokens" in err
    codex_home = tmp_path / "home" / ".codex"
    assert (codex_home / "config.toml").is_file() and (codex_home / "gmlx.config.toml").is_file()
    assert '"POST /v1/responses HTTP/1.1" 200' in log
    assert (REPAIRED in log) == (model == "gemma")  # developer, developer, user, user: repaired on Gemma only
