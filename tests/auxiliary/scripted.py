"""A scripted embeddings backend for fast route tests (the real one is proven in the slow tests): words become
token ids, each id a fixed random direction, and `gate` can hold a request on the worker thread."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from gmlx_server.auxiliary.embeddings import fit_window
from gmlx_server.config import ServiceEntry


class ScriptedEmbedder:
    backend = "scripted"
    dimensions, window, vocab_size, normalize = 8, 16, 1000, True

    def __init__(self) -> None:
        self.gate: threading.Event | None = None
        self.started = threading.Event()
        self.table = np.random.default_rng(0).standard_normal((self.vocab_size, self.dimensions)).astype(np.float32)

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        return [[1, *(sum(map(ord, w)) % 900 + 10 for w in t.split()), 2] for t in texts]

    def embed(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        self.started.set()
        if self.gate is not None:
            self.gate.wait(30)
        out = np.stack([self.table[list(s)].mean(axis=0) for s in fit_window(ids, self.window)])
        return np.asarray(out / np.linalg.norm(out, axis=1, keepdims=True), dtype=np.float32)


def scripted_loader(backend: ScriptedEmbedder) -> Any:
    def load(entry: ServiceEntry, path: Path | None) -> ScriptedEmbedder:
        return backend

    return load


def entry(kind: str, model: str | None = "/fake/model", **kw: Any) -> ServiceEntry:
    options = {"embeddings": {"max_batch": 32, "max_inputs": 2048, "matryoshka": False},
               "rerank": {"method": "cosine", "max_documents": 1000},
               "stt": {"max_audio_s": 1800, "max_file_bytes": 25 << 20, "compute_type": "auto"},
               "tts": {"max_input_chars": 4096}}[kind]
    options.update(kw.pop("options", {}))
    return ServiceEntry(kind=kind, id=kw.pop("id", kind), model=model, options=MappingProxyType(options), **kw)
