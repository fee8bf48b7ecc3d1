"""POST /v1/embeddings in OpenAI's shape: the request checked field by field, the response built from vectors."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gmlx_server.auxiliary.embeddings import Embedder, fit_window
from gmlx_server.errors import InvalidRequest, clip

FORMATS = ("float", "base64")


@dataclass(frozen=True)
class EmbeddingsRequest:
    model: str | None
    texts: tuple[str, ...] | None  # one of texts / token arrays
    tokens: tuple[tuple[int, ...], ...] | None
    encoding_format: str = "float"
    dimensions: int | None = None
    truncate: bool = False

    @property
    def count(self) -> int:
        return len(self.texts if self.texts is not None else self.tokens or ())


def body_object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise InvalidRequest("the request body must be a JSON object")
    return body


def optional_str(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(f"'{name}' must be a string", param=name)
    return value


def positive_int(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise InvalidRequest(f"'{name}' must be a positive integer", param=name)
    return value


def flag(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise InvalidRequest(f"'{name}' must be true or false", param=name)
    return value


def _is_ints(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool)
                                                           for t in value)


def _inputs(raw: Any, max_inputs: int) -> tuple[tuple[str, ...] | None, tuple[tuple[int, ...], ...] | None]:
    if isinstance(raw, str) or _is_ints(raw):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("'input' must be a non-empty string, a list of strings, or token arrays", param="input")
    if len(raw) > max_inputs:
        raise InvalidRequest(f"'input' holds {len(raw)} items, more than the {max_inputs} a request may hold "
                             "(services.embeddings.max_inputs)", param="input")
    if all(isinstance(x, str) for x in raw):
        empty = next((i for i, x in enumerate(raw) if not x), None)
        if empty is not None:
            raise InvalidRequest(f"'input[{empty}]' is an empty string", param="input")
        return tuple(raw), None
    if all(_is_ints(x) for x in raw):
        if any(t < 0 for x in raw for t in x):
            raise InvalidRequest("'input' token ids must not be negative", param="input")
        return None, tuple(tuple(x) for x in raw)
    raise InvalidRequest("'input' must be a string, a list of strings, a token array or a list of token arrays "
                         "(not a mix)", param="input")


def parse_embeddings(body: Any, max_inputs: int) -> EmbeddingsRequest:
    body = body_object(body)
    if "input" not in body:
        raise InvalidRequest("'input' is required", param="input")
    texts, tokens = _inputs(body["input"], max_inputs)
    fmt = body.get("encoding_format") or "float"
    if fmt not in FORMATS:
        raise InvalidRequest(f"'encoding_format' must be float or base64, not {clip(str(fmt))!r}",
                             param="encoding_format")
    return EmbeddingsRequest(optional_str(body, "model"), texts, tokens, fmt, positive_int(body, "dimensions"),
                             flag(body, "truncate", False))


def check_dimensions(req: EmbeddingsRequest, native: int, matryoshka: bool) -> int:
    """The output width: the model's own, or fewer when the model is configured as Matryoshka-trained."""
    want = req.dimensions
    if want is None or want == native:
        return native
    if not matryoshka:
        raise InvalidRequest(f"'dimensions' {want}: this model gives {native} dimensions and is not configured as "
                             "Matryoshka-trained (services.embeddings.matryoshka), so it cannot shorten them",
                             param="dimensions")
    if want > native:
        raise InvalidRequest(f"'dimensions' {want} is more than the model's {native}", param="dimensions")
    return want


def sequences(req: EmbeddingsRequest, embedder: Embedder) -> list[list[int]]:
    """Token ids per input, within the model's window (cut to it when the request asks for truncation)."""
    seqs = embedder.tokenize(req.texts) if req.texts is not None else [list(t) for t in req.tokens or ()]
    bad = next((t for s in seqs for t in s if t >= embedder.vocab_size), None)
    if bad is not None:
        raise InvalidRequest(f"'input': token id {bad} is outside the vocabulary (size {embedder.vocab_size})",
                             param="input")
    window = embedder.window
    for i, s in enumerate(seqs):
        if len(s) > window and not req.truncate:
            raise InvalidRequest(f"'input[{i}]' is too long: {len(s)} tokens, over the model's window of {window} "
                                 "tokens (send \"truncate\": true to cut it)", param="input",
                                 code="context_length_exceeded", extra={"tokens": len(s), "window": window})
    if req.texts is None:
        return [s[:window] for s in seqs]
    return fit_window(seqs, window)


def shorten(vectors: np.ndarray, width: int, normalized: bool) -> np.ndarray:
    if width == vectors.shape[1]:
        return vectors
    out = vectors[:, :width]
    if normalized:
        out = out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return out


def embeddings_response(vectors: np.ndarray, fmt: str, model: str, prompt_tokens: int) -> dict[str, Any]:
    def encode(v: np.ndarray) -> Any:
        return base64.b64encode(v.astype("<f4").tobytes()).decode() if fmt == "base64" else v.tolist()

    data = [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vectors)]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}


def count_tokens(seqs: Sequence[Sequence[int]]) -> int:
    return sum(len(s) for s in seqs)
