"""The test MCP server (mcp_server.py) as the assistants' tests use it: its config entries, its HTTP process,
and its call log (what really reached its tools)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.server import free_port

SERVER = Path(__file__).resolve().parent / "mcp_server.py"


def stdio_entry(call_log: Path) -> dict[str, Any]:
    """An mcp_servers entry that runs the test server over stdio."""
    return {"command": sys.executable, "args": [str(SERVER), "stdio", str(call_log)]}


def calls(call_log: Path) -> list[dict[str, Any]]:
    """Every call that reached a tool, in order (start lines left out)."""
    return [e for e in entries(call_log) if "tool" in e]


def entries(call_log: Path) -> list[dict[str, Any]]:
    if not call_log.exists():
        return []
    return [json.loads(line) for line in call_log.read_text().splitlines() if line.strip()]


def started_pids(call_log: Path) -> list[int]:
    return [e["pid"] for e in entries(call_log) if e.get("started")]


@contextmanager
def http_server(call_log: Path, log_dir: Path) -> Iterator[str]:
    """The test server over streamable HTTP on a free port: yields its endpoint URL."""
    port = free_port()
    with (log_dir / f"mcp-http-{port}.log").open("wb") as out:
        proc = subprocess.Popen([sys.executable, str(SERVER), "http", str(call_log), str(port)], stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url, timeout=1.0)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"the MCP test server did not start on port {port}") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
