"""What every real-client test in tests/agents shares: the installed binaries, a clean environment, a
bounded run, and what a client crash looks like in its output."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.server import ROOT, LiveServer, gmlx_serve

CLIENTS = Path(__file__).parent / "node_modules" / ".bin"
RUN_S = 420  # one client run, prefill of the client's prompt on 2 CPU cores included
CRASH = re.compile(r"TypeError|ReferenceError|Unhandled|panicked at|\n\s+at .+\(.+:\d+:\d+\)")
# Keeps the clients off the network (updates, model catalogues, plugins, telemetry): only loopback answers.
OFFLINE = {"PI_OFFLINE": "1", "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "DISABLE_AUTOUPDATER": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
           "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
           "OPENCODE_DISABLE_SHARE": "1"}


def client_bin(name: str) -> Path:
    path = CLIENTS / name
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{path} missing: scripts/install_agents.sh should have installed it")
        pytest.skip(f"{name} is not installed: bash scripts/install_agents.sh")
    return path


def client_env(home: Path, **extra: str) -> dict[str, str]:
    """A clean home, no cloud keys, nothing but loopback for the clients to reach."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANTHROPIC_", "OPENAI_", "CLAUDE_", "CODEX_", "OPENCODE_", "XDG_CONFIG_"))}
    # gmlx launch runs in the client's work directory: ROOT first, so it is this checkout's gmlx, as the server is
    python_path = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return {**env, "HOME": str(home), "PATH": f"{CLIENTS}:{Path(sys.executable).parent}:{env['PATH']}",
            "PYTHONPATH": python_path, **OFFLINE, **extra}


def run(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=RUN_S,
                          stdin=subprocess.DEVNULL)


def gmlx_launch(client: str, model: str, url: str, *args: str) -> list[str]:
    """`gmlx launch CLIENT --model MODEL --url URL ARGS...` as this interpreter runs it."""
    return [sys.executable, "-m", "gmlx_server.cli", "launch", client, "--model", model, "--url", url, *args]


@contextmanager
def config_server(d: Path, config: str) -> Iterator[LiveServer]:
    """`gmlx serve --config` on this YAML text, written to d/gmlx.yaml."""
    path = d / "gmlx.yaml"
    path.write_text(config)
    with gmlx_serve(["--config", str(path)], d) as server:
        yield server
