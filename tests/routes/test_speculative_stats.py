"""A speculative model on fake engines: the /v1/models marker, the request row's speculative object and the
per-model totals in /v1/metrics, and the Prometheus counters; a model without a drafter shows none of them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gmlx_server.config import Draft
from gmlx_server.engine.types import EngineStats, RequestRow, SpeculativeStats
from tests.fakes import FakeBehavior, FakeFactory
from tests.routes.conftest import Served, make_config, serve

PER_REQUEST = SpeculativeStats(rounds=3, drafted=12, accepted=9)


@pytest.fixture
def spec() -> Iterator[Served]:
    config = make_config(("m1", "plain"), default="m1")
    models = dict(config.models)
    models["m1"] = replace(models["m1"], draft=Draft("/fake/small.gguf", "small", 5))
    s = serve(replace(config, models=models), FakeFactory(FakeBehavior(speculative=PER_REQUEST), drafts=True))
    yield s
    s.client.close()


def _models(s: Served) -> dict[str, object]:
    return {m["id"]: m["speculative"] for m in s.client.get("/v1/models").json()["data"]}


def test_the_models_marker_names_the_drafter_and_how_it_batches(spec: Served) -> None:
    marker = {"draft": "small", "draft_tokens": 5, "verdict": "speculative", "verdict_batched": "plain"}
    assert _models(spec) == {"m1": marker, "plain": False}  # configured, not yet resident
    assert spec.chat().status_code == 200
    assert _models(spec)["m1"] == marker
    spec.engine().info = replace(spec.engine().info, drafts=False)  # an engine that runs no drafter says so
    assert _models(spec)["m1"] is False


def test_finished_requests_add_up_per_model_in_metrics_and_prometheus(spec: Served) -> None:
    for _ in range(2):
        assert spec.chat().status_code == 200
    server = spec.client.get("/v1/metrics").json()["server"]
    by_model = {m["id"]: m["speculative"] for m in server["resident_models"]}
    assert by_model == {"m1": {"rounds": 6, "drafted": 24, "accepted": 18, "accept_rate": 0.75}}
    text = spec.client.get("/v1/metrics", params={"format": "prometheus"}).text
    samples = {(s.name, s.labels.get("model")): s.value for f in text_string_to_metric_families(text)
               for s in f.samples if s.name.startswith("gmlx_speculative_")}
    assert samples == {("gmlx_speculative_rounds_total", "m1"): 6.0,
                       ("gmlx_speculative_drafted_tokens_total", "m1"): 24.0,
                       ("gmlx_speculative_accepted_tokens_total", "m1"): 18.0}


def test_a_model_without_a_drafter_reports_none() -> None:
    plain = serve()
    try:
        assert plain.chat().status_code == 200
        server = plain.client.get("/v1/metrics").json()["server"]
        assert server["resident_models"][0]["speculative"] is None
        text = plain.client.get("/v1/metrics", params={"format": "prometheus"}).text
        assert 'gmlx_speculative_rounds_total{model="m1"} 0.0' in text  # a counter at zero, not a missing one
    finally:
        plain.client.close()


def test_a_live_row_carries_its_drafting(spec: Served) -> None:
    assert spec.chat().status_code == 200
    rows = (RequestRow("r1", "decode", 10, 6, 32, 1.0, 0.2, 5.0, speculative=SpeculativeStats(2, 8, 5)),
            RequestRow("r2", "queued", 4, 0, 32, 0.1, None, None))
    spec.engine().stats = lambda: EngineStats(4, 1, 1, rows)
    requests = {r["id"]: r for r in spec.client.get("/v1/metrics").json()["server"]["requests"]}
    assert requests["r1"]["speculative"] == {"rounds": 2, "drafted": 8, "accepted": 5, "accept_rate": 0.625}
    assert requests["r2"]["speculative"] is None
