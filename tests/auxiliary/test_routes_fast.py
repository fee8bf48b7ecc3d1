"""The service host over the real app in process: unconfigured routes, the missing extra, the concurrency cap,
/v1/models rows and the metrics (a scripted embeddings backend; the real models are in the slow tests)."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gmlx_server.app import create_app
from gmlx_server.auxiliary.service_host import ServiceHost
from gmlx_server.config import ServerConfig, ServiceEntry
from gmlx_server.serving.model_host import ModelHost
from tests.auxiliary.scripted import ScriptedEmbedder, entry, scripted_loader
from tests.fakes import FakeFactory
from tests.hostile.harness import FUZZ, Client, check
from tests.hostile.strategies import requests
from tests.routes.conftest import SyncClient, make_config

ROUTES = [("/v1/embeddings", "embeddings"), ("/v1/rerank", "rerank"), ("/rerank", "rerank"),
          ("/v1/audio/transcriptions", "stt"), ("/v1/audio/translations", "stt"), ("/v1/audio/speech", "tts"),
          ("/v1/systemone", "systemone"), ("/systemone", "systemone")]


def app_with(services: dict[str, ServiceEntry], backend: Any = None) -> tuple[SyncClient, ServiceHost]:
    config: ServerConfig = replace(make_config(), services=MappingProxyType(services))
    host = ModelHost(config, FakeFactory(), check_headers=False)
    svc = ServiceHost(config, host, scripted_loader(backend)) if backend is not None else ServiceHost(config, host)
    return SyncClient(create_app(config, host=host, services=svc)), svc


@pytest.mark.parametrize(("path", "kind"), ROUTES)
def test_an_unconfigured_route_names_the_key_that_enables_it(path: str, kind: str) -> None:
    client, _ = app_with({})
    files = {"file": ("a.wav", b"RIFF....", "audio/wav")} if "audio/trans" in path else None
    r = client.post(path, files=files) if files else client.post(path, json={"input": "x", "query": "q"})
    client.close()
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert err["type"] == "service_not_configured" and err["config_key"] == f"services.{kind}"
    assert f"services.{kind}" in err["message"]
    if kind == "systemone":
        assert "cannot serve one yet" in err["message"]


def test_without_the_extra_the_route_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "mlx_embeddings", None)  # as if gmlx[services] were not installed
    monkeypatch.setitem(sys.modules, "mlx_embeddings.utils", None)
    client, _ = app_with({"embeddings": entry("embeddings", str(tmp_path))})
    r = client.post("/v1/embeddings", json={"input": "hello"})
    rows = {row["id"]: row for row in client.get("/v1/models").json()["data"]}
    client.close()
    assert r.status_code == 501, r.text
    err = r.json()["error"]
    assert err["type"] == "service_extra_missing" and "pip install 'gmlx[services]'" in err["message"]
    assert rows["embeddings"]["load_error"] == "mlx_embeddings is not installed"


def test_a_request_over_the_cap_gets_503_with_retry_after_and_is_counted() -> None:
    backend = ScriptedEmbedder()
    backend.gate = threading.Event()
    client, _ = app_with({"embeddings": entry("embeddings", max_concurrent=1)}, backend)

    async def burst() -> tuple[Any, Any]:
        first = asyncio.create_task(client.client.post("/v1/embeddings", json={"input": "held on the worker"}))
        while not backend.started.is_set():
            await asyncio.sleep(0.01)
        second = await client.client.post("/v1/embeddings", json={"input": "one too many"})
        assert backend.gate is not None
        backend.gate.set()
        return await first, second

    first, second = client.runner.run(burst())
    metrics = client.get("/v1/metrics").json()["server"]["services"]["embeddings"]
    prom = client.get("/v1/metrics?format=prometheus").text
    client.close()
    assert first.status_code == 200 and second.status_code == 503, second.text
    assert second.json()["error"]["type"] == "server_overloaded" and int(second.headers["Retry-After"]) >= 1
    assert "services.embeddings.max_concurrent 1" in second.json()["error"]["message"]
    assert (metrics["requests"], metrics["rejections"], metrics["errors"], metrics["in_flight"]) == (2, 1, 0, 0)
    assert metrics["bytes_out"] == len(first.content) and metrics["bytes_in"] > 0
    assert 'gmlx_service_rejections_total{model="embeddings",service="embeddings"} 1.0' in prom
    assert 'gmlx_service_latency_seconds_count{model="embeddings",service="embeddings"} 1.0' in prom


def test_models_lists_services_with_their_kind_and_aliases() -> None:
    client, _ = app_with({"embeddings": entry("embeddings", id="mini", aliases=("text-embedding-3-small",))},
                         ScriptedEmbedder())
    before = {row["id"]: row for row in client.get("/v1/models").json()["data"]}
    client.post("/v1/embeddings", json={"input": "x", "model": "text-embedding-3-small"})
    after = {row["id"]: row for row in client.get("/v1/models").json()["data"]}
    one = client.get("/v1/models/mini").json()
    wrong = client.post("/v1/embeddings", json={"input": "x", "model": "gpt-4"})
    client.close()
    assert before["m1"]["kind"] == "chat"
    assert before["mini"]["kind"] == "embeddings" and before["mini"]["state"] == "unloaded"
    assert before["text-embedding-3-small"]["alias_of"] == "mini"
    assert after["mini"]["state"] == "ready" and after["mini"]["resident"] is True and one["id"] == "mini"
    assert wrong.status_code == 404 and wrong.json()["error"]["available_models"] == ["mini",
                                                                                     "text-embedding-3-small"]


def test_embeddings_shape_and_typed_400s() -> None:
    client, _ = app_with({"embeddings": entry("embeddings")}, ScriptedEmbedder())
    ok = client.post("/v1/embeddings", json={"input": ["a b", "c"], "encoding_format": "base64"}).json()
    bad = {name: client.post("/v1/embeddings", json=body).json()["error"] for name, body in {
        "input": {"input": []}, "encoding_format": {"input": "a", "encoding_format": "int8"},
        "dimensions": {"input": "a", "dimensions": 4}, "window": {"input": " ".join(["w"] * 40)},
        "mixed": {"input": ["a", [1, 2]]}, "vocab": {"input": [[5, 5000]]}}.items()}
    cut = client.post("/v1/embeddings", json={"input": " ".join(["w"] * 40), "truncate": True})
    client.close()
    assert [d["index"] for d in ok["data"]] == [0, 1] and isinstance(ok["data"][0]["embedding"], str)
    assert ok["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert {k: v["param"] for k, v in bad.items()} == {"input": "input", "encoding_format": "encoding_format",
                                                       "dimensions": "dimensions", "window": "input",
                                                       "mixed": "input", "vocab": "input"}
    assert bad["window"]["code"] == "context_length_exceeded" and "42 tokens" in bad["window"]["message"]
    assert cut.status_code == 200 and cut.json()["usage"]["prompt_tokens"] == 16


def test_cosine_rerank_on_the_embeddings_service_orders_and_cuts() -> None:
    client, services = app_with({"embeddings": entry("embeddings"), "rerank": entry("rerank", model=None)},
                                ScriptedEmbedder())
    docs = ["red green", "blue", "red green blue"]
    r = client.post("/rerank", json={"query": "red green", "documents": docs, "top_n": 2})
    plain = client.post("/v1/rerank", json={"query": "red green", "documents": [{"text": d} for d in docs],
                                            "return_documents": False})
    bad = client.post("/v1/rerank", json={"query": "q", "documents": "not a list"})
    client.close()
    results = r.json()["results"]
    assert [x["index"] for x in results] == [0, 2] and results[0]["document"] == {"text": "red green"}
    assert results[0]["relevance_score"] == pytest.approx(1.0, abs=1e-5)
    assert [x["index"] for x in plain.json()["results"]] == [0, 2, 1]
    assert "document" not in plain.json()["results"][0]
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "documents"
    assert services.services["rerank"].stats.outcomes["ok"] == 2


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[Client]:
    config: ServerConfig = replace(make_config(), services=MappingProxyType(
        {"embeddings": entry("embeddings"), "rerank": entry("rerank", model=None)}))
    host = ModelHost(config, FakeFactory(), check_headers=False)
    c = Client(create_app(config, host=host, services=ServiceHost(config, host, scripted_loader(ScriptedEmbedder()))))
    yield c
    c.close()


@pytest.mark.parametrize("route", ["/v1/embeddings", "/v1/rerank"])
@settings(FUZZ, max_examples=60)
@given(data=st.data())
def test_hostile_bodies_to_configured_services_get_typed_answers(fuzzed: Client, route: str,
                                                                 data: st.DataObject) -> None:
    req = data.draw(requests("POST", route, "m1"))
    check(req, fuzzed.send(req))


def test_a_loaded_service_model_counts_as_held_for_the_chat_load_gate(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 4096)  # its size on disk is what loading it holds
    client, services = app_with({"embeddings": entry("embeddings", str(tmp_path))}, ScriptedEmbedder())
    assert services.chat is not None and services.chat.held_elsewhere() == {}
    assert client.post("/v1/embeddings", json={"input": "hello"}).status_code == 200
    assert services.chat.held_elsewhere() == {"service embeddings": 4096}
    services.close()
    assert services.chat.held_elsewhere() == {}
    client.close()
