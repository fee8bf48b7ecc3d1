"""Every Grafana panel's PromQL against a real Prometheus scraping two real `gmlx serve` hosts (SmolLM2; the
first also runs an LLM rerank service, so the service panels have series; two hosts, so the Fleet row has
an `instance` each).

Prometheus runs with grafana/prometheus.yml (the committed scrape config), pointed at the test servers
and scraping every second, bound to 127.0.0.1 on a free port. After a few requests (some refused at a
queue cap of 1, so the rejection series exist), each panel query must return at least one series and
name only metrics the server exports. scripts/install_prometheus.sh installs Debian's `prometheus`.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.assistants.tools_server import stdio_entry
from tests.conftest import smollm2_path
from tests.e2e.server import LiveServer, free_port, gmlx_serve
from tests.top.promql import GRAFANA, exported, metric_names, queries, unknown

pytestmark = pytest.mark.slow
PROMETHEUS = shutil.which("prometheus") or ("/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK)
                                           else None)
BODY = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4,
        "temperature": 0}
SERIES_DEADLINE_S = 90.0


def _config(servers: list[LiveServer], path: Path) -> Path:
    config = yaml.safe_load((GRAFANA / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    job = config["scrape_configs"][0]
    job["static_configs"] = [{"targets": [s.base_url.removeprefix("http://") for s in servers]}]
    path.write_text(yaml.safe_dump(config))
    return path


@contextmanager
def prometheus(config: Path, data: Path) -> Iterator[str]:
    assert PROMETHEUS
    port = free_port()
    cmd = [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={data}",
           f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    with open(data.parent / "prometheus.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: httpx.get(base + "/-/ready", timeout=2).status_code == 200, 60, "prometheus ready",
              lambda: (data.parent / "prometheus.log").read_text(errors="replace")[-3000:])
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _wait(ready: Any, timeout_s: float, what: str, detail: Any = lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{what}: not after {timeout_s} s\n{detail()}")


def query(base: str, expr: str) -> list[dict[str, Any]]:
    r = httpx.get(base + "/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", f"{expr}: {body.get('error', r.text)}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


async def _burst(base: str, n: int, body: dict[str, Any] = BODY) -> list[int]:
    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(300)) as c:
        responses = await asyncio.gather(*[c.post("/v1/chat/completions", json=body) for _ in range(n)])
    return [r.status_code for r in responses]


def _drive(server: LiveServer, other: LiveServer) -> None:
    """One request to load the model, then a burst against a queue cap of 1: some finish, some get 503. A rerank
    (the LLM rerank service) for the service panels; one request on the other host, a second `instance`. The
    first request sets a field gmlx ignores (metadata), for the ignored-fields panel."""
    httpx.post(server.v1 + "/chat/completions", json={**BODY, "metadata": {"run": "prometheus"}},
               timeout=300).raise_for_status()
    codes = asyncio.run(asyncio.wait_for(_burst(server.base_url, 6), timeout=300))
    assert 200 in codes and 503 in codes, codes
    rerank = {"query": "a colour", "documents": ["red", "a chair"]}
    httpx.post(server.v1 + "/rerank", json=rerank, timeout=300).raise_for_status()
    httpx.post(other.v1 + "/chat/completions", json=BODY, timeout=300).raise_for_status()
    ask = {"model": "capitals", "max_tokens": 48, "messages": [{"role": "user", "content": "Capital of France?"}]}
    httpx.post(server.v1 + "/chat/completions", json=ask, timeout=300).raise_for_status()


def _exported(server: LiveServer) -> set[str]:
    text = httpx.get(server.v1 + "/metrics", params={"format": "prometheus"}, timeout=10).text
    return exported(text_string_to_metric_families(text))


def _empty_queries(base: str, todo: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Poll until every query returns a series (the rate windows need a few scrapes); return the empty ones."""
    deadline = time.monotonic() + SERIES_DEADLINE_S
    while todo and time.monotonic() < deadline:
        todo = [(where, expr) for where, expr in todo if not query(base, expr)]
        if todo:
            time.sleep(1.0)
    return todo


@pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary: run scripts/install_prometheus.sh (as root)")
def test_every_dashboard_query_returns_series_from_a_real_prometheus(tmp_path: Path) -> None:
    panels = queries()
    assert len(panels) > 30
    env = {"GMLX_QUEUE_DEPTH_CAP": "1", "GMLX_DECODE_BATCH": "1"}
    # SmolLM2 also scores an LLM rerank service, so gmlx_service_* exist; its disk tier is on for the disk panels
    config = tmp_path / "gmlx.yaml"
    config.write_text(f"server:\n  prompt_cache_disk_bytes: 64MiB\n  prompt_cache_dir: {tmp_path / 'pc'}\n"
                      f"models:\n  smollm2:\n    path: {smollm2_path()}\n"
                      "services:\n  rerank: {method: llm, model: smollm2}\n"
                      f"mcp_servers:\n  caps: {json.dumps(stdio_entry(tmp_path / 'calls.jsonl'))}\n"
                      "assistants:\n  capitals: {model: smollm2, tools: {caps: [lookup_capital]}, "
                      "tool_choice: required}\n")  # an assistant's tool call, for the assistant panels
    with gmlx_serve(["--config", str(config)], tmp_path, env=env) as server, gmlx_serve([], tmp_path) as other, \
            prometheus(_config([server, other], tmp_path / "prometheus.yml"), tmp_path / "tsdb") as prom:
        _wait(lambda: len([s for s in query(prom, 'up{job="gmlx"}') if s["value"][1] == "1"]) == 2, 60,
              "gmlx scraped", lambda: httpx.get(prom + "/api/v1/targets", timeout=5).text)
        _drive(server, other)
        names = _exported(server)
        never = sorted({f"{where}: {n}" for where, expr in panels for n in metric_names(expr) if unknown(n, names)})
        assert not never, "panels name metrics the server never exports:\n" + "\n".join(never)
        empty = _empty_queries(prom, panels)
        assert not empty, "panel queries with no series:\n" + "\n".join(f"{w}: {e}" for w, e in empty)
        fleet = dict(panels)  # the Fleet row: both hosts, one series each
        assert query(prom, fleet["gmlx-overview / Hosts reporting / A"])[0]["value"][1] == "2"
        per_host = query(prom, fleet["gmlx-overview / Decode tok/s per host / A"])
        hosts = {u.base_url.removeprefix("http://") for u in (server, other)}
        assert {s["metric"]["instance"] for s in per_host} == hosts


ROUTER_WIDTH = 2
ROUTER = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")
# EOS banned: each runs to its cap, long enough that one round of two streams spans several 1 s scrapes
LONG = {**BODY, "max_tokens": 256, "logit_bias": {"0": -100, "2": -100}}


def _series(base: str, name: str, start: float, end: float) -> list[float]:
    r = httpx.get(base + "/api/v1/query_range", timeout=10,
                  params={"query": f'{name}{{model_name="smollm2"}}', "start": start, "end": end, "step": "1s"})
    result = r.json()["data"]["result"]
    assert len(result) == 1, f"{name}: {result}"
    return [float(v) for _, v in result[0]["values"]]


@pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary: run scripts/install_prometheus.sh (as root)")
def test_router_gauges_move_in_a_real_prometheus_during_a_burst(tmp_path: Path) -> None:
    """Four 256-token streams at a decode width of 2: two wait, two run, the KV share grows as they decode
    (a round must span several 1 s scrapes: at 40 and then, once decode got faster, 96 tokens the scrapes caught
    only each round's start)."""
    env = {"GMLX_DECODE_BATCH": str(ROUTER_WIDTH), "GMLX_QUEUE_DEPTH_CAP": "8"}
    with gmlx_serve([], tmp_path, env=env) as server, \
            prometheus(_config([server], tmp_path / "prometheus.yml"), tmp_path / "tsdb") as prom:
        httpx.post(server.v1 + "/chat/completions", json=BODY, timeout=300).raise_for_status()  # loads the model
        _wait(lambda: query(prom, 'vllm:num_requests_running{model_name="smollm2"}'), 60, "router gauges scraped")
        start = time.time()
        time.sleep(2)  # idle scrapes first: the burst is seen rising from them
        codes = asyncio.run(asyncio.wait_for(_burst(server.base_url, 4, LONG), timeout=300))
        assert codes == [200] * 4, codes
        time.sleep(3)  # two more scrapes after the last stream
        series = {name: _series(prom, name, start, time.time()) for name in ROUTER}
    waiting, running, kv = (series[n] for n in ROUTER)
    print({n.removeprefix("vllm:"): s for n, s in series.items()})
    assert max(waiting) > 0 and max(running) == ROUTER_WIDTH, series
    assert kv[0] == 0 and kv[-1] == 0 and 0 < max(kv) <= 1, kv
    assert any(b > a > 0 for a, b in pairwise(kv)), kv  # it grows while streams decode

