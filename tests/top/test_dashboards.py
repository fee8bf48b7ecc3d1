"""The Grafana dashboards, provisioning and scrape config: generated JSON up to date, panels well formed,
and every metric a panel reads is one the server's Prometheus rendering produces.

The real-Prometheus proof (every query returns series) is tests/e2e/test_prometheus.py.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gmlx_server.engine.prompt_cache import PromptCache
from gmlx_server.serving.prometheus import make_registry, render
from gmlx_server.serving.telemetry import Telemetry
from tests.top.fakes import recorded
from tests.top.promql import DASHBOARDS, GRAFANA, exported, load, metric_names, panels, queries, unknown


@functools.cache
def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grafana_generate", GRAFANA / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _rendered_names() -> set[str]:
    """What the collector exports for the busy recording with telemetry that saw traffic and a rejection,
    and one model's prompt cache."""
    t = Telemetry()
    t.model("smollm2").finished["stop"] += 1
    t.ttft.observe(0.4)
    t.latency.observe(2.0)
    t.record_reject("queue_full")
    cache = PromptCache(1 << 20).stats()  # a resident model's prompt cache, as /v1/cache/stats reports it
    snapshot = recorded("busy")
    snapshot["server"]["services"] = {"rerank": {  # one service that answered a request (gmlx_service_*)
        "id": "judge", "state": "ready", "in_flight": 0, "requests": 1, "errors": 0, "rejections": 0,
        "bytes_in": 100, "bytes_out": 80, "latency_s_sum": 0.2, "latency_buckets": [[0.25, 1], ["+Inf", 1]]}}
    snapshot["server"]["assistants"] = {"helper": {  # one assistant whose tool answered once (gmlx_assistant_*)
        "model": "smollm2", "servers": {"docs": {"transport": "stdio", "state": "ready", "restarts": 0}},
        "tools": {"search": {"outcomes": {"ok": 1}, "latency_s_sum": 0.1, "latency_buckets": [[0.25, 1], ["+Inf", 1]]}},
        "active": []}}
    text = render(make_registry(lambda: snapshot, t, lambda: {"smollm2": cache})).decode()
    return exported(text_string_to_metric_families(text))


def test_the_committed_json_is_what_the_generator_writes() -> None:
    assert {p.name for p in DASHBOARDS} == set(_generator().dashboards())
    assert _generator().main(["--check"]) == 0, "run: .venv/bin/python grafana/generate.py"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_panels_are_well_formed(path: Path) -> None:
    board = load(path)
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids))
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "instance", "model"}
    for panel in panels(board):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs))


def test_every_metric_a_panel_reads_is_exported() -> None:
    names = _rendered_names()
    missing = {(where, n) for where, expr in queries() for n in metric_names(expr) if unknown(n, names)}
    assert not missing


def test_each_family_of_the_rendering_has_a_panel() -> None:
    """The other direction: the dashboards leave out only duplicates (queue.waiting and queue.cap are on the
    Queue panel), a constant, and the vllm:* gauges, which are for routers (the models dashboard reads the same
    rows as gmlx_resident_models_*)."""
    read = {n for _, expr in queries() for n in metric_names(expr)}
    families = {n for n in _rendered_names() if not any(n.endswith(s) for s in ("_bucket", "_sum", "_count"))}
    unread = {f for f in families if not any(r == f or r.startswith(f + "_") for r in read)
              and not f.startswith("vllm:")}
    assert unread <= {"gmlx_concurrency_waiting", "gmlx_concurrency_queue_cap", "gmlx_capacity_kv_dtype_bytes"}, unread


def test_metric_names_are_parsed_out_of_promql() -> None:
    expr = ('histogram_quantile(0.9, sum by (le) (rate(gmlx_x_seconds_bucket{model=~".*"}[30s]))) '
            '/ ignoring(band) 2 * gmlx_b{band="red"} + on(instance) group_left() gmlx_c offset 5m')
    assert metric_names(expr) == {"gmlx_x_seconds_bucket", "gmlx_b", "gmlx_c"}


def test_scrape_config_and_provisioning() -> None:
    scrape = yaml.safe_load((GRAFANA / "prometheus.yml").read_text())["scrape_configs"][0]
    assert scrape["metrics_path"] == "/v1/metrics" and scrape["params"] == {"format": ["prometheus"]}
    assert scrape["static_configs"][0]["targets"] == ["127.0.0.1:8080"]
    ds = yaml.safe_load((GRAFANA / "provisioning/datasources/gmlx.yaml").read_text())["datasources"][0]
    assert ds["type"] == "prometheus"
    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/gmlx.yaml").read_text())["providers"][0]
    assert provider["type"] == "file" and provider["options"]["path"]
