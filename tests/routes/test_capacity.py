"""Capacity routes on fake engines over the real SmolLM2 header: estimate, plan verdicts, preflight, overcommit."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from gmlx_server.app import create_app
from gmlx_server.config import RuntimeEnv
from gmlx_server.engine.types import EngineStats
from gmlx_server.serving.model_host import ModelHost
from tests.conftest import smollm2_path
from tests.fakes import FakeFactory
from tests.routes.conftest import Served, SyncClient, make_config

QUESTION = {"messages": [{"role": "user", "content": "What is the capital of France?"}]}


HOSTS: dict[int, ModelHost] = {}


def _serve(env: RuntimeEnv | None = None) -> Served:
    """An app over fake engines whose model entry points at the real SmolLM2 GGUF (header only)."""
    cfg = make_config(env=env or RuntimeEnv(sse_keepalive_s=0.05))
    models = {m: replace(e, path=smollm2_path()) for m, e in cfg.models.items()}
    cfg = replace(cfg, models=models)
    factory = FakeFactory()
    host = ModelHost(cfg, factory, check_headers=False)
    app = create_app(cfg, host=host)
    served = Served(app, SyncClient(app), factory, cfg)
    HOSTS[id(served)] = host
    return served


def _host(s: Served) -> ModelHost:
    return HOSTS[id(s)]


@pytest.fixture
def s() -> Iterator[Served]:
    served = _serve()
    yield served
    served.client.close()


def test_estimate_before_the_model_is_resident_does_not_load_it(s: Served) -> None:
    r = s.client.post("/v1/estimate", json={"model": "m1", **QUESTION, "max_tokens": 50})
    assert r.status_code == 200, r.text
    e = r.json()
    assert e["resident"] is False and "m1" not in s.factory.engines  # the dry run loaded nothing
    assert e["prompt_tokens"] > 10 and e["context_limit"] == 8192 and e["context_ok"] is True
    assert e["need_bytes"] > 0 and e["fits_drained"] is True and e["cache_tier"] == "miss"
    assert s.chat().status_code == 200
    again = s.client.post("/v1/estimate", json={"model": "m1", **QUESTION, "max_tokens": 50}).json()
    assert again["resident"] is True


def test_estimate_context_limit_and_need_grows_with_max_tokens(s: Served) -> None:
    small = s.client.post("/v1/estimate", json={"model": "m1", **QUESTION, "max_tokens": 10}).json()
    big = s.client.post("/v1/estimate", json={"model": "m1", **QUESTION, "max_tokens": 8190}).json()
    assert big["need_bytes"] > small["need_bytes"] and big["context_ok"] is False


def test_plan_ok_from_the_table_and_admit_now_from_live_state(s: Served) -> None:
    ok = s.client.get("/v1/capacity/plan", params={"width": 2, "depth": 1024}).json()
    assert ok["ok"] is True and ok["admit_now"] is True and ok["reason"] is None
    wide = s.client.get("/v1/capacity/plan", params={"width": 9999, "depth": 1024}).json()
    assert wide["ok"] is False and wide["admit_now"] is False and "capacity table" in wide["reason"]
    deep = s.client.get("/v1/capacity/plan", params={"width": 1, "depth": 9000}).json()
    assert deep["ok"] is False and "context window" in deep["reason"]


def test_plan_admit_now_fails_on_waiting_slots_and_band(s: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    s.chat()
    engine = s.engine()
    monkeypatch.setattr(engine, "stats", lambda: EngineStats(4, 1, 2))
    assert "waiting" in s.client.get("/v1/capacity/plan", params={"width": 1, "depth": 64}).json()["reason"]
    monkeypatch.setattr(engine, "stats", lambda: EngineStats(4, 3, 0))
    r = s.client.get("/v1/capacity/plan", params={"width": 2, "depth": 64}).json()
    assert r["ok"] is True and r["admit_now"] is False and "1 decode slots" in r["reason"]
    monkeypatch.setattr(engine, "stats", lambda: EngineStats(4, 0, 0))
    gov = _host(s).governor
    gov.band = "yellow"  # under yellow only one free slot counts
    r = s.client.get("/v1/capacity/plan", params={"width": 2, "depth": 64}).json()
    assert r["admit_now"] is False and "yellow" in r["reason"]
    gov.band = "red"
    assert "memory band is red" in s.client.get("/v1/capacity/plan", params={"width": 1, "depth": 64}).json()["reason"]


@pytest.mark.parametrize("query", [{"width": 0, "depth": 10}, {"width": "x", "depth": 10}, {"depth": 10}])
def test_plan_rejects_bad_parameters_with_a_typed_400(s: Served, query: dict[str, object]) -> None:
    r = s.client.get("/v1/capacity/plan", params=query)
    assert r.status_code == 400 and r.json()["error"]["param"] in ("width", "depth")


def test_models_carry_max_context_at_width_1_for_the_boot_model(s: Served) -> None:
    row = s.client.get("/v1/models").json()["data"][0]
    assert row["max_context_at_width_1"] == 8192


def test_overcommit_nulls_the_table_verdicts() -> None:
    served = _serve(RuntimeEnv(overcommit=True, sse_keepalive_s=0.05))
    try:
        assert served.client.get("/v1/models").json()["data"][0]["max_context_at_width_1"] is None
        plan = served.client.get("/v1/capacity/plan", params={"width": 1, "depth": 1024}).json()
        assert plan["ok"] is None and plan["admit_now"] is True
    finally:
        served.client.close()


def test_memory_preflight_400_says_prompt_is_too_long(monkeypatch: pytest.MonkeyPatch) -> None:
    served = _serve()
    try:
        cap = _host(served).capacity
        monkeypatch.setattr(cap, "drained_bytes", lambda model_id: 1000)  # as if only 1 kB were left
        r = served.chat()
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["message"].startswith("prompt is too long") and "bytes" in err["message"]
    finally:
        served.client.close()


def test_preflight_switch_off_admits_the_same_request(monkeypatch: pytest.MonkeyPatch) -> None:
    served = _serve(RuntimeEnv(preflight_mem=False, sse_keepalive_s=0.05))
    try:
        monkeypatch.setattr(_host(served).capacity, "drained_bytes", lambda model_id: 1000)
        assert served.chat().status_code == 200
    finally:
        served.client.close()


def test_metrics_capacity_section_is_the_boot_table(s: Served) -> None:
    cap = s.client.get("/v1/metrics").json()["server"]["capacity"]
    assert cap["model"] == "m1" and cap["max_ctx"]["1"] == 8192 and cap["weights_bytes"] > 0


def test_dry_run_on_chat_returns_the_estimate_and_generates_nothing(s: Served) -> None:
    body = {"model": "m1", **QUESTION, "max_tokens": 50}
    dry = s.client.post("/v1/chat/completions", json={**body, "dry_run": True})
    assert dry.status_code == 200
    assert dry.json() == s.client.post("/v1/estimate", json=body).json()
    assert "m1" not in s.factory.engines  # neither call loaded the model


def test_plan_estimates_the_wave_once_a_prefill_was_measured(s: Served) -> None:
    params = {"width": 2, "depth": 100}
    before = s.client.get("/v1/capacity/plan", params=params).json()
    assert before["est_ttft_s"] is None and before["est_drain_s"] is None  # nothing measured, nothing guessed
    s.factory.behavior.prefill_s = 0.01  # the fake's prefill: its prompt's tokens in 10 ms
    s.chat()
    m1 = _host(s).telemetry.models["m1"]
    assert m1.prefill_pace is not None
    one = s.client.get("/v1/capacity/plan", params={"width": 1, "depth": 100}).json()
    two = s.client.get("/v1/capacity/plan", params=params).json()
    # Prefill runs one prompt at a time: the second of two waits for the first (and its first decode step), cold.
    assert one["est_ttft_s"] == pytest.approx(m1.prefill_pace.seconds(0, 100), abs=0.002)
    assert 2 * one["est_ttft_s"] < two["est_ttft_s"] < 2 * one["est_ttft_s"] + 0.05
    assert two["est_drain_s"] > two["est_ttft_s"]
    # A hostile width and depth: the plan cannot run, so no replay of a billion prompts (it once ran unbounded).
    huge = s.client.get("/v1/capacity/plan", params={"width": 10**9, "depth": 10**12}).json()
    assert huge["ok"] is False and huge["est_ttft_s"] is None and huge["est_drain_s"] is None


def test_the_estimate_times_a_prefix_shared_with_a_live_request_as_warm(s: Served) -> None:
    s.factory.behavior.prefill_s = 0.01
    s.chat()  # resident, and a prefill measured
    body = {"model": "m1", **QUESTION, "max_tokens": 50}
    alone = s.client.post("/v1/estimate", json=body).json()
    engine = s.factory.engines["m1"]
    engine.expected_warm = lambda ids: len(ids) - 1  # type: ignore[method-assign]  # the same prompt runs now
    behind = s.client.post("/v1/estimate", json=body).json()
    pace = _host(s).telemetry.models["m1"].prefill_pace
    assert pace is not None and alone["est_ttft_s"] == pytest.approx(pace.seconds(0, alone["prompt_tokens"]), abs=2e-3)
    n = behind["prompt_tokens"]
    assert behind["est_ttft_s"] == pytest.approx(pace.seconds(n - 1, n), abs=2e-3)  # restores are free: unmeasured
    assert behind["warm_tokens"] == alone["warm_tokens"] == 0  # the cache now holds nothing: the routing signal
