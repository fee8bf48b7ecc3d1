"""Rerank scored by a chat model's probability of answering "yes", on real GGUF models over real HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.auxiliary.conftest import write_config
from tests.auxiliary.rerank_set import LABELLED, accuracy
from tests.conftest import qwen_coder_path
from tests.e2e.server import LiveServer, gmlx_serve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("llm-rerank")
    qwen = f"  qwen:\n    path: {qwen_coder_path('0.5b')}\n"
    cfg = write_config(tmp, "  rerank: {method: llm, model: qwen, id: judge}\n", extra_models=qwen)
    with gmlx_serve(["--config", str(cfg)], tmp) as live:
        yield live


def test_a_chat_model_ranks_the_labelled_set(server: LiveServer) -> None:
    acc, scores = accuracy(server.v1, "/rerank", model="judge")
    print(f"llm rerank (Qwen2.5-Coder-0.5B-Instruct, P(yes)) top-1 accuracy: {acc:.2f}")
    assert acc >= 0.75
    assert all(0.0 <= s <= 1.0 for row in scores for s in row)


def test_scores_are_deterministic_and_counted_as_chat_requests(server: LiveServer) -> None:
    query, docs, _ = LABELLED[0]
    body = {"query": query, "documents": docs}
    first = httpx.post(server.v1 + "/rerank", json=body, timeout=300).json()  # greedy: the same scores each time
    second = httpx.post(server.base_url + "/rerank", json=body, timeout=300).json()
    assert first["results"] == second["results"] and first["usage"]["prompt_tokens"] > 40 * len(docs)
    snap = httpx.get(server.v1 + "/metrics").json()["server"]
    assert snap["services"]["rerank"]["requests"] >= 2
    assert any(m["id"] == "qwen" for m in snap["resident_models"])  # the chat engine did the scoring


def test_another_model_name_is_a_404(server: LiveServer) -> None:
    r = httpx.post(server.v1 + "/rerank", json={"query": "q", "documents": ["d"], "model": "other"})
    assert r.status_code == 404 and r.json()["error"]["available_models"] == ["judge"]
