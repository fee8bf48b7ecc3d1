"""GET /v1/models, /models, /v1/models/{id}; GET /health and ?ready=1."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import gguf
import httpx

from gmlx_server.config import ModelEntry, Profile, RuntimeEnv
from tests.fakes import FakeBehavior, FakeEngine, FakeFactory
from tests.routes.conftest import Served, ThreadedServer, make_config, serve

MARKERS = {"resident", "pinned", "speculative", "vlm", "profile", "default", "context_length",
           "max_context_at_width_1"}


def _tiny_gguf(path: Path, context: int) -> str:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(context)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_models_lists_ids_discovered_and_aliases(tmp_path: Path) -> None:
    cfg = make_config(("a", "b@x"), default="a", profiles={"p": Profile("p")}, aliases={"fast": "a@p"})
    disc = ModelEntry(id="found", path=_tiny_gguf(tmp_path / "found.gguf", 8192), discovered=True,
                      max_kv_size=2048)
    cfg = replace(cfg, models=MappingProxyType({**cfg.models, "found": disc}))
    s = serve(cfg)
    for path in ("/v1/models", "/models"):
        body = s.client.get(path).json()
        assert body["object"] == "list"
        rows = {m["id"]: m for m in body["data"]}
        assert list(rows) == ["a", "b@x", "found", "fast"]
        assert all(set(m) >= MARKERS for m in rows.values())
        assert rows["a"]["default"] and not rows["b@x"]["default"]
        assert rows["found"]["discovered"] and rows["found"]["context_length"] == 2048  # min(trained, kv)
        assert rows["fast"]["alias_of"] == "a@p" and rows["fast"]["profile"] == "p"
        assert rows["a"]["max_context_at_width_1"] is None and rows["a"]["resident"] is False
    s.chat({"model": "a"})
    row = s.client.get("/v1/models/a").json()
    assert row["resident"] is True and row["context_length"] == 4096
    assert s.client.get("/v1/models/b@x").json()["id"] == "b@x"
    r = s.client.get("/v1/models/nope")
    assert r.status_code == 404 and r.json()["error"]["available_models"] == ["a", "b@x", "found"]


def test_health_is_minimal(served: Served) -> None:
    assert served.client.get("/health").json() == {"status": "healthy", "pid": os.getpid()}


def test_ready_verdicts(served: Served) -> None:
    r = served.client.get("/health", params={"ready": "1"})
    assert r.status_code == 200 and r.json()["ready"] is True
    served.chat()
    engine = served.engine()
    engine.waiting = 2
    r = served.client.get("/health", params={"ready": "1"})
    assert r.status_code == 503 and r.json()["reason"] == "queue" and "Retry-After" in r.headers
    engine.waiting, engine.decode_batch = 0, 0  # in_flight (0) == decode width: every slot taken
    r = served.client.get("/health", params={"ready": "1"})
    assert r.status_code == 503 and r.json()["reason"] == "busy" and r.json()["ready"] is False


class SlowLoad(FakeFactory):
    """A factory whose load blocks its thread, as a real weight load does."""

    def __call__(self, entry: ModelEntry, env: RuntimeEnv) -> FakeEngine:
        time.sleep(0.5)
        return super().__call__(entry, env)


def test_health_never_waits_on_a_loading_or_streaming_model() -> None:
    s = serve(make_config(), SlowLoad(FakeBehavior(prefill_s=0.3, token_s=0.05)))
    body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with ThreadedServer(s.app) as url, httpx.Client(base_url=url, timeout=10) as c:
        chat = threading.Thread(target=lambda: c.post("/v1/chat/completions", json=body))
        chat.start()
        worst = 0.0
        while chat.is_alive():
            t0 = time.perf_counter()
            assert c.get("/health").status_code == 200
            worst = max(worst, time.perf_counter() - t0)
            time.sleep(0.02)
        chat.join()
    assert s.factory.calls == 1
    assert worst < 0.2
