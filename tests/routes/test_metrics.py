"""/v1/metrics JSON and Prometheus on fake engines: sections, independence of probes, naming rules."""

from __future__ import annotations

import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gmlx_server.app import create_app
from gmlx_server.config import RuntimeEnv
from gmlx_server.engine.types import EngineStats, RequestRow
from gmlx_server.serving.governor import Governor
from gmlx_server.serving.memory_probes import MemoryReading
from gmlx_server.serving.model_host import ModelHost
from gmlx_server.serving.snapshot import SECTION_KEYS
from tests.fakes import FakeFactory
from tests.routes.conftest import Served, SyncClient, make_config, serve

SECTIONS = ("concurrency", "queue", "requests", "resident_models", "governor", "memory", "capacity", "rates")
NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def test_snapshot_has_every_section_and_counts_a_finished_request(served: Served) -> None:
    assert served.chat().status_code == 200
    body = served.client.get("/v1/metrics").json()
    server = body["server"]
    assert set(SECTIONS) <= server.keys()
    for name, keys in SECTION_KEYS.items():
        assert set(keys) <= server[name].keys(), name
    assert server["resident_models"][0]["id"] == "m1"
    assert server["memory"]["budget_bytes"] and server["memory"]["headroom_bytes"] is not None
    assert server["rates"]["decode_tok_s_lifetime"] is not None
    assert server["concurrency"]["queue_cap"] == server["queue"]["cap"]
    assert served.client.get("/metrics").json()["server"].keys() == server.keys()
    tokens = server["tokens"]  # the fake writes no thinking block: no reasoning tokens
    assert tokens["by_model"]["m1"]["generated"] == tokens["generated"] > 0 and tokens["reasoning"] == 0
    assert tokens["prompt"] == tokens["by_model"]["m1"]["prompt"] > 0


def test_a_failing_probe_nulls_only_its_section() -> None:
    def boom() -> MemoryReading:
        raise OSError("meminfo unreadable")

    config = make_config()
    host = ModelHost(config, FakeFactory(), check_headers=False)
    host.governor = Governor(True, boom)  # the memory probe fails on every reading
    s = Served(create_app(config, host=host), SyncClient(create_app(config, host=host)), FakeFactory(), config)
    try:
        assert s.chat().status_code == 200
        r = s.client.get("/v1/metrics")
        assert r.status_code == 200
        server = r.json()["server"]
        assert all(v is None for v in server["memory"].values())
        assert server["concurrency"]["decode_batch"] is not None and server["resident_models"]
        assert server["governor"]["band"] is None
    finally:
        s.client.close()


def test_prometheus_text_parses_and_names_follow_the_rules(served: Served) -> None:
    served.chat()
    r = served.client.get("/v1/metrics", params={"format": "prometheus"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    for name in families:
        assert NAME.match(name) and name.startswith(("gmlx_", "vllm:")), name
    for needed in ("gmlx_concurrency_in_flight", "gmlx_queue_eta_s", "gmlx_governor_band",
                   "gmlx_time_to_first_token_seconds", "gmlx_request_duration_seconds", "gmlx_requests"):
        assert needed in families, needed
    bands = {s.labels["band"] for s in families["gmlx_governor_band"].samples}
    assert bands == {"green", "yellow", "orange", "red"}
    models = {s.labels["model"] for s in families["gmlx_resident_models_in_flight"].samples}
    assert models == {"m1"}


def test_unknown_format_is_a_typed_400(served: Served) -> None:
    r = served.client.get("/v1/metrics", params={"format": "xml"})
    assert r.status_code == 400 and r.json()["error"]["type"]


def test_queue_cap_rejection_is_a_503_with_retry_after_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    s = serve(make_config(env=RuntimeEnv(queue_depth_cap=2, sse_keepalive_s=0.05)))
    try:
        assert s.chat().status_code == 200  # loads the engine
        full = EngineStats(1, 1, 2)  # every slot busy and the queue at its cap of 2
        monkeypatch.setattr(s.engine(), "stats", lambda: full)
        r = s.chat()
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_overloaded"
        assert 2 <= int(r.headers["Retry-After"]) <= 60
        q = s.client.get("/v1/metrics").json()["server"]["queue"]
        assert q["rejections"] == 1 and q["last_reject_reason"] == "queue_full"
        monkeypatch.setattr(s.engine(), "stats", lambda: EngineStats(1, 1, 1))
        assert s.chat().status_code == 200  # one below the cap is admitted
    finally:
        s.client.close()


def _row(state: str, prompt: int, generated: int = 0, prefilled: int = 0) -> RequestRow:
    return RequestRow(f"r-{state}-{prompt}", state, prompt, generated, 64, 1.0, None, None,  # type: ignore[arg-type]
                      prefilled=prefilled)


def test_router_gauges_follow_the_engine_under_vllm_names(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    assert served.chat().status_code == 200  # loads m1 (context 4096; at a decode width of 2, a KV budget of 8192)
    rows = (_row("queued", 500), _row("prefill", 900, prefilled=300), _row("decode", 1000, generated=24))
    monkeypatch.setattr(served.engine(), "stats", lambda: EngineStats(2, 2, 1, rows))
    r = served.client.get("/v1/metrics", params={"format": "prometheus"})
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    got = {name: [(s.labels, s.value) for s in families[name].samples]
           for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")}
    assert got["vllm:num_requests_waiting"] == [({"model_name": "m1"}, 1.0)]
    assert got["vllm:num_requests_running"] == [({"model_name": "m1"}, 2.0)]
    # held: the prefilling row's 300 tokens so far and the decoding row's 1000 + 24; the queued row none
    assert got["vllm:kv_cache_usage_perc"] == [({"model_name": "m1"}, round(1324 / 8192, 6))]
    assert "gmlx_resident_models_in_flight" in families  # the gmlx series stay beside them
