"""Embeddings and cosine rerank on the real all-MiniLM-L6-v2 over real HTTP with the openai SDK, against
sentence-transformers on the same files."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from tests.auxiliary.conftest import minilm_dir, write_config
from tests.auxiliary.rerank_set import accuracy
from tests.e2e.server import LiveServer, gmlx_serve

pytestmark = pytest.mark.slow

TEXTS = ["A man is eating food.", "A man is eating a piece of bread.", "The new movie is awesome.",
         "A cheetah is running behind its prey.", "Le chat dort sur le canapé.", "x", "🙂 emoji and ünïcödé"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("emb")
    cfg = write_config(tmp, f"  embeddings: {{model: '{minilm_dir()}', id: minilm, aliases: [text-embedding-3-small],"
                            " max_batch: 4}\n  rerank: {method: cosine}\n")
    with gmlx_serve(["--config", str(cfg)], tmp) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused")


@pytest.fixture(scope="module")
def st_model() -> Any:
    st = pytest.importorskip("sentence_transformers")
    return st.SentenceTransformer(str(minilm_dir()), device="cpu")


@pytest.fixture(scope="module")
def reference(st_model: Any) -> np.ndarray:
    return np.asarray(st_model.encode(TEXTS, normalize_embeddings=False), dtype=np.float64)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_vectors_equal_sentence_transformers(client: openai.OpenAI, reference: np.ndarray) -> None:
    r = client.embeddings.create(model="minilm", input=TEXTS)
    got = np.array([d.embedding for d in r.data])
    assert [d.index for d in r.data] == list(range(len(TEXTS))) and got.shape == (len(TEXTS), 384)
    sims = cosines(got, reference)
    print("cosine to sentence-transformers, min:", sims.min())
    assert sims.min() > 1 - 1e-4
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # the model's Normalize module


def test_related_sentences_score_above_unrelated(client: openai.OpenAI) -> None:
    v = np.array([d.embedding for d in client.embeddings.create(model="minilm", input=TEXTS[:4]).data])
    related, unrelated = v[0] @ v[1], max(v[0] @ v[2], v[1] @ v[2], v[0] @ v[3])
    assert related > unrelated + 0.3, (related, unrelated)


def test_batches_base64_tokens_and_usage(client: openai.OpenAI, server: LiveServer, st_model: Any) -> None:
    many = [f"sentence number {i} about {'cats' if i % 2 else 'the weather'}" for i in range(40)]
    batched = np.array([d.embedding for d in client.embeddings.create(model="minilm", input=many).data])
    alone = np.array([client.embeddings.create(model="minilm", input=t).data[0].embedding for t in many[:5]])
    assert np.abs(batched[:5] - alone).max() < 1e-5  # padding in a batch of 4 changes nothing
    raw = httpx.post(server.v1 + "/embeddings", json={"input": TEXTS[:2], "encoding_format": "base64",
                                                      "model": "text-embedding-3-small"}).json()
    floats = client.embeddings.create(model="minilm", input=TEXTS[:2])
    decoded = np.frombuffer(base64.b64decode(raw["data"][1]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, floats.data[1].embedding, atol=1e-6)
    ids = st_model.tokenizer(TEXTS[:2])["input_ids"]
    assert raw["usage"]["prompt_tokens"] == floats.usage.prompt_tokens == len(ids[0]) + len(ids[1])
    tokens = httpx.post(server.v1 + "/embeddings", json={"input": ids[0]})  # the model's own ids, in full
    assert np.allclose(tokens.json()["data"][0]["embedding"], floats.data[0].embedding, atol=1e-5)


def test_the_window_is_a_typed_400_unless_truncation_is_asked(client: openai.OpenAI, server: LiveServer,
                                                               st_model: Any) -> None:
    long = "word " * 300
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="minilm", input=["fine", long])
    err = e.value.body
    assert isinstance(err, dict) and err["param"] == "input" and "input[1]" in err["message"]
    assert err["code"] == "context_length_exceeded" and "256" in err["message"]
    cut = httpx.post(server.v1 + "/embeddings", json={"input": long, "truncate": True}).json()
    ref = st_model.encode([long])  # it truncates at 256 too
    assert cut["usage"]["prompt_tokens"] == 256
    assert float(cosines(np.array([cut["data"][0]["embedding"]]), ref)[0]) > 1 - 1e-4
    with pytest.raises(openai.BadRequestError, match="Matryoshka"):
        client.embeddings.create(model="minilm", input="x", dimensions=128)
    assert len(client.embeddings.create(model="minilm", input="x", dimensions=384).data[0].embedding) == 384


def test_cosine_rerank_ranks_the_labelled_set(server: LiveServer) -> None:
    acc, _ = accuracy(server.v1, "/rerank")
    also, _ = accuracy(server.base_url, "/rerank")
    print(f"cosine rerank (all-MiniLM-L6-v2) top-1 accuracy: {acc:.2f}")
    assert acc >= 0.9 and also == acc


def test_the_service_is_in_models_and_metrics(server: LiveServer) -> None:
    rows = {r["id"]: r for r in httpx.get(server.v1 + "/models").json()["data"]}
    assert rows["minilm"]["kind"] == "embeddings" and rows["minilm"]["state"] == "ready"
    assert rows["rerank"]["kind"] == "rerank" and rows["rerank"]["method"] == "cosine"
    section = httpx.get(server.v1 + "/metrics").json()["server"]["services"]
    assert section["embeddings"]["requests"] >= 5 and section["embeddings"]["bytes_out"] > 0
    assert section["rerank"]["requests"] >= 24 and section["embeddings"]["weights_bytes"] > 80e6
    assert Path(rows["minilm"]["model"]) == minilm_dir()
