"""POST /v1/rerank in the Cohere/Jina shape (as llama.cpp and vLLM serve it), and the cosine scorer.

Scores: cosine of the embeddings model's normalized vectors (-1 to 1) for method cosine; for method llm the
probability that a chat model answers "yes" to "does the document meet the query" (0 to 1, see llm_rerank).
Both are deterministic: no sampling is involved.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gmlx_server.auxiliary.embeddings import Embedder, fit_window
from gmlx_server.auxiliary.embeddings_wire import body_object, flag, optional_str, positive_int
from gmlx_server.errors import InvalidRequest


@dataclass(frozen=True)
class RerankRequest:
    model: str | None
    query: str
    documents: tuple[str, ...]
    top_n: int | None
    return_documents: bool


def _document(doc: Any, i: int) -> str:
    text = doc.get("text") if isinstance(doc, Mapping) else doc
    if not isinstance(text, str):
        raise InvalidRequest(f"'documents[{i}]' must be a string or an object with a 'text' string",
                             param="documents")
    return text


def parse_rerank(body: Any, max_documents: int) -> RerankRequest:
    b = body_object(body)
    query = b.get("query")
    if not isinstance(query, str) or not query.strip():
        raise InvalidRequest("'query' must be a non-empty string", param="query")
    docs = b.get("documents")
    if not isinstance(docs, list) or not docs:
        raise InvalidRequest("'documents' must be a non-empty list", param="documents")
    if len(docs) > max_documents:
        raise InvalidRequest(f"'documents' holds {len(docs)} items, more than the {max_documents} allowed "
                             "(services.rerank.max_documents)", param="documents")
    return RerankRequest(optional_str(b, "model"), query, tuple(_document(d, i) for i, d in enumerate(docs)),
                         positive_int(b, "top_n"), flag(b, "return_documents", True))


def cosine_scores(req: RerankRequest, embedder: Embedder) -> tuple[list[float], int]:
    """(cosine of each document with the query, tokens read); texts past the window are cut to it."""
    seqs = fit_window(embedder.tokenize([req.query, *req.documents]), embedder.window)
    vectors = embedder.embed(seqs)
    if not embedder.normalize:
        vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    scores = vectors[1:] @ vectors[0]
    return [float(s) for s in scores], sum(len(s) for s in seqs)


def rerank_response(req: RerankRequest, scores: Sequence[float], model: str, tokens: int) -> dict[str, Any]:
    """Results best first (ties keep document order), cut to top_n."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:req.top_n]
    results = []
    for i in order:
        row: dict[str, Any] = {"index": i, "relevance_score": round(float(scores[i]), 6)}
        if req.return_documents:
            row["document"] = {"text": req.documents[i]}
        results.append(row)
    return {"id": f"rerank-{uuid.uuid4().hex[:24]}", "object": "rerank", "model": model, "results": results,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
