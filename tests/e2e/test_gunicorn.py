"""The documented gunicorn command serves the app: one uvicorn worker, the embedded default model."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.server import ROOT, free_port, production_env

pytestmark = pytest.mark.slow


def test_gunicorn_uvicorn_worker_serves_chat(tmp_path: Path) -> None:
    port = free_port()
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    log = open(tmp_path / "gunicorn.log", "wb")  # noqa: SIM115  (closed below, after the process ends)
    worker = "gmlx_server.gunicorn_worker.UvicornWorker"
    proc = subprocess.Popen([gunicorn, "-k", worker, "-w", "1", "-b", f"127.0.0.1:{port}",
                             "gmlx_server.asgi:app"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env=production_env({"PYTHONUNBUFFERED": "1"}))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        r = httpx.post(base + "/v1/chat/completions", timeout=300, json={
            "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 12,
            "temperature": 0})
        assert r.status_code == 200, (tmp_path / "gunicorn.log").read_text()[-2000:]
        assert "Paris" in r.json()["choices"][0]["message"]["content"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()
