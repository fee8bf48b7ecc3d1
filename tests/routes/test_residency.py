"""Residency on fake engines: several models, LRU eviction, pinning, the load gate, /unload and /v1/keep.

Fake models get weights (bytes) and the governor reads a fake budget: what the resident fakes hold, plus
memory "the kernel has not returned yet" (lag) where a test wants it. The residency clock is fake too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType, SimpleNamespace
from typing import Any

import httpx
import pytest

from gmlx_server.app import create_app
from gmlx_server.config import ModelEntry, RuntimeEnv, ServerConfig, ServerSettings, load_config
from gmlx_server.engine.types import EngineStats
from gmlx_server.serving.governor import Governor
from gmlx_server.serving.memory_probes import MemoryReading
from gmlx_server.serving.model_host import ModelHost
from tests.fakes import FakeBehavior, FakeEngine, FakeFactory
from tests.routes.conftest import Served, SyncClient, ThreadedServer

BUDGET = 100  # bytes; the gate's floor is 5


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class SizedEngine(FakeEngine):
    def stats(self) -> EngineStats:
        # FakeEngine counts a handle until its generator is finalized; here a finished one stops streaming.
        live = sum(1 for h in self.running if h.finished is None)
        return EngineStats(self.decode_batch, live, self.waiting)


@dataclass
class SizedFactory(FakeFactory):
    weights: dict[str, int] = field(default_factory=dict)

    def __call__(self, entry: ModelEntry, env: RuntimeEnv) -> FakeEngine:
        fake = super().__call__(entry, env)
        engine = SizedEngine(replace(fake.info, weights_bytes=self.weights[entry.id]), fake.behavior,
                             template=fake.template)
        self.engines[entry.id] = engine
        return engine


@dataclass
class Sized:
    s: Served
    host: ModelHost
    clock: Clock
    lag: tuple[int, float] = (0, 0.0)  # bytes still held by the kernel, until this time.monotonic()

    def chat(self, model: str) -> httpx.Response:
        return self.s.chat({"model": model})

    def post(self, path: str, body: Any = None) -> httpx.Response:
        return self.s.client.post(path, json=body)

    def resident(self) -> dict[str, dict[str, Any]]:
        rows = self.s.client.get("/v1/metrics").json()["server"]["resident_models"]
        return {r["id"]: r for r in rows}

    def engine(self, model: str) -> FakeEngine:
        return self.s.factory.engines[model]

    def reading(self) -> MemoryReading:
        used = sum(e.info.weights_bytes for e in self.host.resident.values())
        lag = self.lag[0] if time.monotonic() < self.lag[1] else 0
        # A measured ("auto") budget: free memory is what the machine reports, kernel lag included.
        return MemoryReading(BUDGET, BUDGET - used - lag, None, used or None, None, False)


def sized(weights: dict[str, int], pinned: tuple[str, ...] = (), env: RuntimeEnv | None = None,
          idle_timeout_s: float = 900.0, behavior: FakeBehavior | None = None) -> Sized:
    entries = {m: ModelEntry(id=m, path=f"/fake/{m}.gguf", pinned=m in pinned) for m in weights}
    cfg = ServerConfig(ServerSettings(idle_timeout_s=idle_timeout_s), MappingProxyType(entries),
                       env=env or RuntimeEnv(sse_keepalive_s=0.05))
    factory = SizedFactory(behavior=behavior or FakeBehavior(), weights=weights)
    clock = Clock()
    host = ModelHost(cfg, factory, clock=clock, check_headers=False)
    host.residency.grace_s, host.gate.wait_s = 0.0, 0.3
    for model_id, size in weights.items():  # as if loaded before: the gate knows each model's weights
        host.residency.state(model_id).weights_bytes = size
    out = Sized(Served(None, None, factory, cfg), host, clock)  # type: ignore[arg-type]
    host.governor = Governor(True, out.reading)
    app = create_app(cfg, host=host)
    out.s = Served(app, SyncClient(app), factory, cfg)
    return out


@pytest.fixture
def three() -> Iterator[Sized]:
    z = sized({"a": 40, "b": 40, "c": 40, "p": 60}, pinned=("p",))
    yield z
    z.s.client.close()


def test_models_load_on_first_use_each_on_its_own_engine(three: Sized) -> None:
    assert three.s.factory.engines == {}
    assert three.chat("a").status_code == 200 and three.chat("b").status_code == 200
    assert set(three.s.factory.engines) == {"a", "b"}
    rows = {r["id"]: r for r in three.s.client.get("/v1/models").json()["data"]}
    assert (rows["a"]["resident"], rows["b"]["resident"], rows["c"]["resident"]) == (True, True, False)
    res = three.resident()
    assert res["a"]["loads"] == 1 and res["a"]["weights_bytes"] == 40 and not res["a"]["kept"]


def test_least_recently_used_idle_model_is_evicted_first(three: Sized) -> None:
    for model in ("a", "b"):
        three.chat(model)
        three.clock.advance(1)
    three.chat("a")  # a is now the most recently used
    three.clock.advance(1)
    assert three.chat("c").status_code == 200  # 40 + 40 + 40 leaves less than the floor: one must go
    assert set(three.resident()) == {"a", "c"} and three.engine("b").closed


def test_gate_refuses_beside_a_pinned_model_with_its_numbers(three: Sized) -> None:
    assert three.chat("p").status_code == 200
    r = three.chat("a")  # 100 - 60 (pinned) - 5 (floor) = 35 < 40
    assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
    err = r.json()["error"]
    assert err["type"] == "model_load_deferred"
    for figure in ("40 bytes", "budget of 100", "60 bytes held by pinned or busy", "(p)", "floor of 5", "leaves 35"):
        assert figure in err["message"], figure
    assert set(three.resident()) == {"p"} and "a" not in three.s.factory.engines


def test_gate_refuses_beside_a_busy_model_retry_after_from_its_drain(three: Sized) -> None:
    three.chat("a")
    three.chat("b")
    three.engine("a").waiting = three.engine("b").waiting = 1  # both stream: neither may be evicted
    r = three.chat("c")
    assert r.status_code == 503 and "(a, b)" in r.json()["error"]["message"]
    assert 2 <= int(r.headers["Retry-After"]) <= 60


def test_gate_waits_for_memory_an_unload_is_still_returning(three: Sized) -> None:
    three.chat("p")
    three.post("/unload", {"model": "p"})
    three.lag = (60, time.monotonic() + 0.2)  # the kernel hands the 60 bytes back 0.2 s later
    t0 = time.monotonic()
    assert three.chat("a").status_code == 200
    assert time.monotonic() - t0 >= 0.2


def test_gate_gives_up_after_its_wait(three: Sized) -> None:
    three.lag = (60, time.monotonic() + 60)
    r = three.chat("a")
    assert r.status_code == 503 and "Retry-After" in r.headers
    msg = r.json()["error"]["message"]
    assert "reads 40 of 100 bytes free" in msg and "waited 0.3 s" in msg


def test_a_just_used_model_is_waited_for_not_evicted(three: Sized) -> None:
    three.chat("p")
    three.post("/unload", {"model": "p"})
    three.host.residency.grace_s = 2.0  # a request that got the engine may not have submitted yet
    three.chat("a")
    three.chat("b")
    assert three.chat("p").status_code == 503 and not three.engine("a").closed
    three.clock.advance(3)
    assert three.chat("p").status_code == 200 and three.engine("a").closed and three.engine("b").closed


def test_an_explicit_unload_waits_out_the_handout_grace() -> None:
    z = sized({"a": 10})
    z.host.residency.grace_s = 0.3
    z.chat("a")
    t0 = time.monotonic()
    assert z.post("/unload", {"model": "a"}).json()["unloaded"] == ["a"]
    assert time.monotonic() - t0 >= 0.3


def test_overcommit_turns_the_gate_off() -> None:
    z = sized({"a": 60, "b": 60}, pinned=("a", "b"), env=RuntimeEnv(overcommit=True))
    assert z.chat("a").status_code == 200 and z.chat("b").status_code == 200
    assert set(z.resident()) == {"a", "b"}


def test_pinned_model_unloaded_stays_pinned_and_reloads_on_next_request(three: Sized) -> None:
    three.chat("p")
    r = three.post("/unload", {"model": "p"})
    assert r.status_code == 200 and r.json()["unloaded"] == ["p"]
    row = next(m for m in three.s.client.get("/v1/models").json()["data"] if m["id"] == "p")
    assert row["resident"] is False and row["pinned"] is True
    assert three.chat("p").status_code == 200
    assert three.resident()["p"]["pinned"] is True and three.resident()["p"]["loads"] == 2


def test_unload_answers_409_while_the_model_streams_then_unloads(three: Sized) -> None:
    three.chat("a")
    three.engine("a").waiting = 1
    r = three.post("/unload", {"model": "a"})
    assert r.status_code == 409 and r.json()["error"]["type"] == "model_busy"
    three.engine("a").waiting = 0
    assert three.post("/unload", {"model": "a"}).json()["unloaded"] == ["a"] and three.engine("a").closed


def test_unload_with_no_model_unloads_every_idle_model() -> None:
    z = sized({"a": 10, "b": 10, "p": 10, "c": 10}, pinned=("p",))
    for model in ("a", "b", "p"):
        z.chat(model)
    z.engine("b").waiting = 1
    body = z.post("/unload").json()
    assert sorted(body["unloaded"]) == ["a", "p"] and body["busy"] == ["b"]
    assert z.post("/unload", {"model": "c"}).json()["unloaded"] == []  # not resident: nothing to do
    r = z.post("/unload", {"model": "org/repo"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "model_not_found"


def test_keep_warms_and_outlasts_the_idle_timeout_until_released() -> None:
    z = sized({"a": 10, "b": 10}, idle_timeout_s=60)
    body = z.post("/v1/keep", {"model": "a"}).json()
    assert body["kept"] and body["resident"] and body["warm_s"] is not None and body["loads"] == 1
    warm = z.engine("a").submitted
    assert len(warm) == 1 and warm[0].max_tokens == 1 and warm[0].sampling.greedy
    z.chat("b")
    assert z.resident()["a"]["kept"] is True
    z.clock.advance(61)
    assert z.s.client.runner.run(z.host.sweep()) == ["b"]  # the idle sweep spares the kept model
    z.post("/v1/keep", {"model": "a", "keep": False})
    assert z.resident()["a"]["kept"] is False
    z.clock.advance(61)
    assert z.s.client.runner.run(z.host.sweep()) == ["a"]


def test_keep_without_warm_up_and_release_of_a_model_not_resident() -> None:
    z = sized({"a": 10, "b": 10})
    body = z.post("/v1/keep", {"model": "a", "warm": False}).json()
    assert body["kept"] and body["warm_s"] is None and z.engine("a").submitted == []
    body = z.post("/v1/keep", {"model": "b", "keep": False}).json()
    assert body == {"model": "b", "kept": False, "resident": False, "warm_s": None, "loads": 0, "lifetime": None}
    for bad in ({"model": "a", "warm": "yes"}, {"model": 5}, [1]):
        assert z.post("/v1/keep", bad).status_code == 400


def test_a_kept_model_stays_lru_evictable_under_pressure(three: Sized) -> None:
    three.post("/v1/keep", {"model": "a"})
    three.clock.advance(1)
    three.chat("b")
    three.clock.advance(1)
    assert three.chat("c").status_code == 200 and three.engine("a").closed
    three.chat("a")  # back after the eviction, and still kept: only an explicit /unload ends a keep
    assert three.resident()["a"]["kept"] is True


def test_the_idle_sweep_runs_in_the_lifespan() -> None:
    z = sized({"a": 10}, idle_timeout_s=0.2)
    z.host.residency.clock = time.monotonic
    with ThreadedServer(z.s.app) as url:
        body = {"model": "a", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(url + "/v1/chat/completions", json=body).status_code == 200
        deadline = time.monotonic() + 5
        while not z.engine("a").closed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "a" not in z.host.resident and z.engine("a").closed


def test_unload_409_while_a_real_stream_is_open() -> None:
    z = sized({"a": 10}, behavior=FakeBehavior(pieces=["x"] * 20, token_s=0.05))
    with ThreadedServer(z.s.app) as url:
        body = {"model": "a", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body) as stream:
            lines = stream.iter_lines()  # kept open: a dropped iterator closes the stream (a disconnect)
            next(line for line in lines if '"x"' in line)  # the engine is generating
            r = httpx.post(url + "/unload", json={"model": "a"})
            assert r.status_code == 409
            assert "1 in flight" in r.json()["error"]["message"]
            assert "data: [DONE]" in list(lines)
        assert httpx.post(url + "/unload", json={"model": "a"}).json()["unloaded"] == ["a"]


# --- POST /v1/reload ----------------------------------------------------------------------------------

MODELS = "models:\n  a:\n    path: a.gguf\n  b:\n    path: b.gguf\n"


@pytest.fixture
def yaml_served(tmp_path: Path) -> Iterator[tuple[Served, ModelHost, Path]]:
    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.gguf").write_bytes(b"GGUF")
    path = tmp_path / "gmlx.yaml"
    path.write_text(MODELS)
    cfg = load_config(str(path), env=RuntimeEnv(sse_keepalive_s=0.05))
    factory = SizedFactory(weights={"a": 1, "b": 1, "c": 1})
    host = ModelHost(cfg, factory, check_headers=False)
    host.residency.grace_s = 0.0
    app = create_app(cfg, host=host)
    s = Served(app, SyncClient(app), factory, cfg)
    yield s, host, path
    s.client.close()


def test_reload_keeps_unchanged_engines_and_registers_new_models(yaml_served: tuple[Served, ModelHost, Path],
                                                                 ) -> None:
    s, host, path = yaml_served
    s.chat({"model": "a"})
    s.chat({"model": "b"})
    a = s.engine("a")
    path.write_text(MODELS.replace("a.gguf\n", "a.gguf\n    profile: precise\n")
                    .replace("b.gguf\n", "b.gguf\n    max_kv_size: 512\n") + "  c:\n    path: c.gguf\n")
    body = s.client.post("/v1/reload").json()
    assert body["status"] == "reloaded" and body["added"] == ["c"] and body["changed"] == ["b"]
    assert body["unchanged"] == ["a"] and body["kept_loaded"] == ["a"] and body["removed"] == []
    assert host.resident["a"] is a and s.factory.calls == 2 and s.engine("b").closed  # b: new load parameters
    rows = {r["id"]: r for r in s.client.get("/v1/models").json()["data"]}
    assert rows["a"]["profile"] == "precise" and rows["a"]["resident"] and not rows["b"]["resident"]
    assert s.chat({"model": "c"}).status_code == 200 and s.chat({"model": "b"}).status_code == 200
    assert s.engine("b").info.context_length == 512
    loads = {r["id"]: r["loads"] for r in s.client.get("/v1/metrics").json()["server"]["resident_models"]}
    assert loads == {"a": 1, "b": 2, "c": 1}


def test_reload_unloads_a_changed_busy_model_once_its_requests_finish(
        yaml_served: tuple[Served, ModelHost, Path]) -> None:
    s, host, path = yaml_served
    s.chat({"model": "b"})
    s.engine("b").waiting = 1
    path.write_text(MODELS.replace("  b:\n    path: b.gguf\n", ""))
    assert s.client.post("/v1/reload").json()["removed"] == ["b"]
    assert "b" in host.resident and s.chat({"model": "b"}).status_code == 404
    s.engine("b").waiting = 0
    assert s.client.runner.run(host.sweep()) == ["b"] and s.engine("b").closed


def test_reload_with_a_broken_file_keeps_the_running_config(yaml_served: tuple[Served, ModelHost, Path]) -> None:
    s, host, path = yaml_served
    s.chat({"model": "a"})
    path.write_text(MODELS + "    pinned: maybe\n")
    r = s.client.post("/v1/reload")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_config"
    assert "the running config is kept" in r.json()["error"]["message"]
    assert "models.b.pinned: expected bool" in r.json()["error"]["message"]
    assert list(host.config.models) == ["a", "b"] and "a" in host.resident


def test_reload_is_unsupported_outside_config_mode(served: Served) -> None:
    r = served.client.post("/v1/reload")
    assert r.status_code == 200 and r.json() == {"status": "unsupported"}


def test_mlx_memory_is_counted_once_however_many_engines_are_resident() -> None:
    cfg = ServerConfig(ServerSettings(memory_budget=1000), MappingProxyType(
        {m: ModelEntry(id=m, path=f"/fake/{m}.gguf") for m in ("a", "b")}))
    factory = FakeFactory()
    host = ModelHost(cfg, factory, check_headers=False)
    app = create_app(cfg, host=host)
    s = Served(app, SyncClient(app), factory, cfg)
    for model, active in (("a", 300), ("b", 400)):  # each engine's snapshot reads the one process-wide allocator
        s.chat({"model": model})
        s.engine(model).memory = SimpleNamespace(active_bytes=active, cache_bytes=0)
    assert host.governor.read().available_bytes == 600
    s.client.close()


def test_service_models_count_as_held_by_the_load_gate(three: Sized) -> None:
    three.host.held.hold("service embeddings", 30)
    assert three.chat("a").status_code == 200  # 100 - 30 - 5 = 65 leaves room for 40
    three.clock.advance(1)
    assert three.chat("b").status_code == 200  # 30 + 40 + 40 + 5 > 100: idle a goes, not the service
    assert set(three.resident()) == {"b"} and three.engine("a").closed
    r = three.chat("p")  # 100 - 30 (the service) - 5 (floor) = 65: 60 fits only once b is evicted
    assert r.status_code == 200 and set(three.resident()) == {"p"}
    r = three.chat("a")  # 100 - 60 (pinned) - 30 (the service) - 5 = 5 < 40
    assert r.status_code == 503
    assert "service embeddings" in r.json()["error"]["message"]
