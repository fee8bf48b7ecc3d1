"""Residency on a real server with both real models, and the Hugging Face policy with the network fenced off.

The budget (1.4 GB) holds Gemma 3 270M (~1072 MB dense) or SmolLM2 (~538 MB dense) beside the 5% floor,
never both: requests for one evict the other, unless a pin holds it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import gemma_path, smollm2_path
from tests.e2e.server import ROOT, LiveServer, gmlx_serve, production_env

pytestmark = pytest.mark.slow
TIMEOUT = httpx.Timeout(300)
# Dense weights (about 0.5 and 1.1 GB): the budget holds one model at a time whatever layout auto would pick.
CONFIG = """server:
  default_model: smollm2
  memory_budget: 1400000000
models:
  smollm2:
    path: {smollm2}
    weights: dense
  gemma:
    path: {gemma}
    weights: dense
"""
RELOADED = """  smollm2:
    path: {smollm2}
    weights: dense
    pinned: true
    profile: precise
  smollm2-copy:
    path: {smollm2}
    weights: dense
"""


def chat(s: LiveServer, model: str, **kw: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2, **kw}
    return httpx.post(s.v1 + "/chat/completions", json=body, timeout=TIMEOUT)


def resident(s: LiveServer) -> dict[str, bool]:
    return {m["id"]: m["resident"] for m in httpx.get(s.v1 + "/models", timeout=10).json()["data"]}


def rows(s: LiveServer) -> dict[str, dict[str, Any]]:
    server = httpx.get(s.v1 + "/metrics", timeout=10).json()["server"]
    return {r["id"]: r for r in server["resident_models"]}


def stream_long(s: LiveServer) -> str:
    text = "The quick brown fox jumps over the lazy dog. " * 150  # ~1500 tokens: seconds of prefill on CPU
    body = {"model": "smollm2", "stream": True, "max_tokens": 4, "messages": [{"role": "user", "content": text}]}
    with httpx.stream("POST", s.v1 + "/chat/completions", json=body, timeout=TIMEOUT) as r:
        return r.read().decode()


def wait_streaming(s: LiveServer, model: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        row = rows(s).get(model)
        if row and row["in_flight"] + row["waiting"] > 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"{model} never streamed")


def test_two_real_models_swap_pin_unload_keep_and_reload(tmp_path: Path) -> None:
    paths = {"smollm2": smollm2_path(), "gemma": gemma_path()}
    config = tmp_path / "gmlx.yaml"
    config.write_text(CONFIG.format(**paths))
    with gmlx_serve(["--config", str(config)], tmp_path) as s:
        # Alternating requests swap the two models: the budget never holds both.
        for model, other in (("smollm2", "gemma"), ("gemma", "smollm2"), ("smollm2", "gemma")):
            assert chat(s, model).status_code == 200
            assert resident(s) == {model: True, other: False}
        assert rows(s)["smollm2"]["loads"] == 2

        # Reload: pin smollm2 and change its profile, add a model. The loaded engine is not reloaded.
        before, capacity = rows(s)["smollm2"], httpx.get(s.v1 + "/metrics").json()["server"]["capacity"]
        config.write_text(CONFIG.split("  smollm2:")[0].format(**paths) + RELOADED.format(**paths)
                          + f"  gemma:\n    path: {paths['gemma']}\n    weights: dense\n")
        body = httpx.post(s.v1 + "/reload", timeout=60).json()
        assert body["added"] == ["smollm2-copy"] and body["kept_loaded"] == ["smollm2"], body
        after = rows(s)["smollm2"]
        for key in ("loads", "weights_bytes", "active_bytes", "load_s"):
            assert after[key] == before[key], key
        assert after["pinned"] is True and after["profile"] == "precise"
        assert httpx.get(s.v1 + "/metrics").json()["server"]["capacity"] == capacity  # boot table kept
        assert "smollm2-copy" in resident(s)

        # The pinned model survives: gemma cannot load beside it.
        r = chat(s, "gemma")
        assert r.status_code == 503 and r.json()["error"]["type"] == "model_load_deferred", r.text
        assert "held by pinned or busy resident models (smollm2)" in r.json()["error"]["message"]
        assert int(r.headers["Retry-After"]) >= 1 and resident(s)["smollm2"]

        # /unload answers 409 while streams are open, and unloads the (pinned) model after.
        with ThreadPoolExecutor(4) as pool:
            streams = [pool.submit(stream_long, s) for _ in range(4)]
            wait_streaming(s, "smollm2")
            r = httpx.post(s.base_url + "/unload", json={"model": "smollm2"}, timeout=60)
            assert r.status_code == 409 and r.json()["error"]["type"] == "model_busy", r.text
            assert all(f.result().rstrip().endswith("data: [DONE]") for f in streams)
        r = httpx.post(s.base_url + "/unload", json={"model": "smollm2"}, timeout=60)
        assert r.status_code == 200 and r.json()["unloaded"] == ["smollm2"]
        listed = {m["id"]: m for m in httpx.get(s.v1 + "/models").json()["data"]}
        assert listed["smollm2"]["resident"] is False and listed["smollm2"]["pinned"] is True

        assert chat(s, "gemma").status_code == 200 and resident(s)["gemma"]

        # /v1/keep reloads the pinned model (evicting idle gemma) and warms it; keep and release show.
        body = httpx.post(s.v1 + "/keep", json={"model": "smollm2"}, timeout=TIMEOUT).json()
        assert body["kept"] and body["warm_s"] is not None and body["loads"] == 3, body
        assert resident(s)["gemma"] is False
        row = rows(s)["smollm2"]
        assert row["kept"] is True and row["pinned"] is True
        httpx.post(s.v1 + "/keep", json={"model": "smollm2", "keep": False}, timeout=60).raise_for_status()
        assert rows(s)["smollm2"]["kept"] is False


GUARD = '''"""Test guard: any outbound (non-loopback) connection or name lookup is refused and logged."""
import os
import socket

_LOG = os.environ["GMLX_NET_GUARD_LOG"]
_connect, _connect_ex, _getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo


def _local(host):
    return host in (None, "localhost", "::1", b"localhost") or str(host).startswith("127.")


def _refuse(what):
    with open(_LOG, "a") as f:
        f.write(what + "\\n")
    raise OSError("network guard: refused " + what)


def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _local(address[0]):
        _refuse("connect %r" % (address,))
    return _connect(self, address)


def connect_ex(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _local(address[0]):
        _refuse("connect_ex %r" % (address,))
    return _connect_ex(self, address)


def getaddrinfo(host, *args, **kwargs):
    if not _local(host):
        _refuse("getaddrinfo %r" % (host,))
    return _getaddrinfo(host, *args, **kwargs)


socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = connect, connect_ex, getaddrinfo
'''
HF_CONFIG = """server:
  hf_cache: true
  default_model: cached
models:
  cached:
    path: hf:local/smol/model.gguf
  cached-repo:
    path: local/smol
  remote:
    path: HuggingFaceTB/SmolLM2-135M-Instruct
"""
HUB_IDS = ("HuggingFaceTB/SmolLM2-135M-Instruct", "hf:HuggingFaceTB/SmolLM2-135M-Instruct/model.gguf",
           "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct", "org/repo@main")

BODIES = {"/chat/completions": {"messages": [{"role": "user", "content": "hi"}]}, "/completions": {"prompt": "hi"},
          "/messages": {"messages": [{"role": "user", "content": "hi"}]}, "/responses": {"input": "hi"}}


def _fenced_env(tmp_path: Path, hub: Path) -> tuple[dict[str, str], Path]:
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(GUARD)
    log = tmp_path / "attempts.log"
    pythonpath = os.pathsep.join(p for p in (str(guard), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": pythonpath, "GMLX_NET_GUARD_LOG": str(log), "HF_HUB_CACHE": str(hub)}, log


def _hub(tmp_path: Path) -> Path:
    snap = tmp_path / "hub" / "models--local--smol" / "snapshots" / "rev1"
    snap.mkdir(parents=True)
    (snap / "model.gguf").symlink_to(smollm2_path())
    return tmp_path / "hub"


def test_resolving_and_loading_models_never_reaches_the_network(tmp_path: Path) -> None:
    hub = _hub(tmp_path)
    env, log = _fenced_env(tmp_path, hub)
    probe = subprocess.run([sys.executable, "-c", "import socket; socket.create_connection(('1.1.1.1', 443), 2)"],
                           env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0 and "network guard" in probe.stderr  # the fence works in a child process
    log.unlink()

    missing = tmp_path / "missing.yaml"
    missing.write_text("models:\n  m:\n    path: hf:HuggingFaceTB/SmolLM2-135M-Instruct/model.gguf\n")
    run = subprocess.run([sys.executable, "-m", "gmlx_server.cli", "serve", "--config", str(missing)], cwd=ROOT,
                         env=production_env(env), capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "not in the local Hugging Face cache" in run.stderr, run.stderr

    config = tmp_path / "gmlx.yaml"
    config.write_text(HF_CONFIG)
    with gmlx_serve(["--config", str(config)], tmp_path, env=env) as s:
        assert chat(s, "cached").status_code == 200  # an hf: ref, from the local cache
        assert chat(s, "cached-repo").status_code == 200  # a repo id, from the cache (server.hf_cache)
        r = chat(s, "remote")
        assert r.status_code == 403 and r.json()["error"]["type"] == "hf_access_disabled", r.text
        for model in HUB_IDS:
            for path, body in BODIES.items():
                r = httpx.post(s.v1 + path, json={"model": model, "max_tokens": 2, **body}, timeout=60)
                assert r.status_code == 404, (model, path, r.text)
    assert not log.exists(), log.read_text()  # no connection or lookup was even attempted
    assert "network guard" not in s.log()
