"""A real `gmlx serve` process on a free loopback port, for end-to-end tests over real HTTP."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    import anthropic
    import openai

ROOT = Path(__file__).resolve().parents[2]
NO_TORCH = ROOT / "tests" / "no_torch"  # its sitecustomize.py hides torch


def production_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """os.environ and `env` for a gmlx process the tests start: without torch, as a production install runs
    (the test set-up adds torch for the transformers reference; a server loading it starts 3-5 s slower)."""
    full = {**os.environ, **(env or {})}
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(NO_TORCH), full.get("PYTHONPATH", "")) if p)
    return full


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LiveServer:
    base_url: str  # http://127.0.0.1:PORT
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def gmlx_serve(args: Sequence[str], log_dir: Path, env: dict[str, str] | None = None,
               timeout_s: float = 180.0, cwd: Path = ROOT, port: int | None = None,
               tls_ca: str | None = None) -> Iterator[LiveServer]:
    """Start `gmlx serve ARGS --port P` (the gmlx_server found from `cwd`; P free, or `port` to restart a host on
    its address), wait for /health, yield, then stop it (SIGINT, then kill). `tls_ca`: the server speaks HTTPS
    with a certificate this file verifies."""
    port = port or free_port()
    log_path = log_dir / f"gmlx-serve-{port}.log"
    full_env = production_env({**(env or {}), "PYTHONUNBUFFERED": "1"})
    cmd = [sys.executable, "-m", "gmlx_server.cli", "serve", *args, "--host", "127.0.0.1", "--port", str(port)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    server = LiveServer(f"{'https' if tls_ca else 'http'}://127.0.0.1:{port}", proc, log_path)
    try:
        _wait_healthy(server, timeout_s, ssl.create_default_context(cafile=tls_ca) if tls_ca else True)
        yield server
    finally:
        _stop(proc)


@contextmanager
def serve_config(log_dir: Path, yaml_text: str, env: dict[str, str] | None = None) -> Iterator[LiveServer]:
    """`gmlx serve --config` of this YAML (written into log_dir as gmlx.yaml), as gmlx_serve runs it."""
    config = log_dir / "gmlx.yaml"
    config.write_text(yaml_text)
    with gmlx_serve(["--config", str(config)], log_dir, env=env) as s:
        yield s


def _wait_healthy(server: LiveServer, timeout_s: float, verify: ssl.SSLContext | bool = True) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"gmlx serve exited with {server.proc.returncode}:\n{server.log()[-4000:]}")
        try:
            if httpx.get(server.base_url + "/health", timeout=2, verify=verify).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"gmlx serve not healthy after {timeout_s} s:\n{server.log()[-4000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def openai_client(server: LiveServer, timeout_s: float = 300, api_key: str = "unused") -> openai.OpenAI:
    """The official OpenAI SDK on `server`'s /v1, without retries (a retry would hide a failure)."""
    import openai

    return openai.OpenAI(base_url=server.v1, api_key=api_key, max_retries=0, timeout=timeout_s)


def anthropic_client(server: LiveServer, timeout_s: float = 300, api_key: str = "unused") -> anthropic.Anthropic:
    """The official Anthropic SDK on `server`, without retries."""
    import anthropic

    return anthropic.Anthropic(base_url=server.base_url, api_key=api_key, max_retries=0, timeout=timeout_s)
