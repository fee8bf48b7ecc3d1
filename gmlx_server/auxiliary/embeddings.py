"""Sentence embeddings on MLX through mlx-embeddings: a BERT-family encoder from a local directory, pooled and
normalized the way its sentence-transformers config says (1_Pooling, a Normalize module), so its vectors are
the ones sentence-transformers gives for the same model. Runs on the service's worker thread only."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

POOLING = ("mean", "cls", "max")


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_layout(path: Path) -> tuple[str, bool, int | None]:
    """(pooling, normalize, window) from the sentence-transformers files; mean, normalized, the model's own."""
    modules = json.loads((path / "modules.json").read_text()) if (path / "modules.json").exists() else []
    normalize = any(str(m.get("type", "")).endswith("Normalize") for m in modules) if modules else True
    pooling_dir = next((m.get("path") for m in modules if str(m.get("type", "")).endswith("Pooling")), "1_Pooling")
    pool = _json(path / str(pooling_dir) / "config.json")
    mode = "cls" if pool.get("pooling_mode_cls_token") else "max" if pool.get("pooling_mode_max_tokens") else "mean"
    window = _json(path / "sentence_bert_config.json").get("max_seq_length")
    return mode, normalize, int(window) if isinstance(window, int) else None


class Embedder:
    """The loaded encoder: token counting and batched, pooled embeddings (float32, one row per input)."""

    backend = "mlx-embeddings"

    def __init__(self, path: Path, max_batch: int) -> None:
        import mlx.core as mx
        from mlx_embeddings.utils import load_model
        from tokenizers import Tokenizer

        if not (path / "config.json").exists():
            raise ValueError(f"{path} is not a model directory (no config.json)")
        self.mx = mx
        self.model = load_model(path)
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        config = _json(path / "config.json")
        self.pooling, self.normalize, window = read_layout(path)
        trained = int(config.get("max_position_embeddings") or 512)
        self.window = min(window, trained) if window else trained
        self.dimensions = int(config.get("hidden_size") or 0)
        self.vocab_size = self.tokenizer.get_vocab_size()
        self.pad_id = int(config.get("pad_token_id") or 0)
        self.max_batch = max_batch

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(e.ids) for e in self.tokenizer.encode_batch(list(texts))]

    def embed(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        """One float32 row per sequence, batched by length so padding stays small."""
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = np.zeros((len(ids), self.dimensions), dtype=np.float32)
        for start in range(0, len(order), self.max_batch):
            chunk = order[start:start + self.max_batch]
            out[chunk] = self._batch([ids[i] for i in chunk])
        return out

    def _batch(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        mx = self.mx
        width = max(len(s) for s in seqs)
        tokens = np.full((len(seqs), width), self.pad_id, dtype=np.int32)
        mask = np.zeros((len(seqs), width), dtype=np.float32)
        for row, seq in enumerate(seqs):
            tokens[row, :len(seq)] = seq
            mask[row, :len(seq)] = 1.0
        hidden = self.model(mx.array(tokens), attention_mask=mx.array(mask)).last_hidden_state
        m = mx.array(mask)[..., None]
        if self.pooling == "cls":
            pooled = hidden[:, 0, :]
        elif self.pooling == "max":
            pooled = mx.max(mx.where(m > 0, hidden, -1e9), axis=1)
        else:
            pooled = mx.sum(hidden * m, axis=1) / mx.maximum(mx.sum(m, axis=1), 1e-9)
        if self.normalize:
            pooled = pooled / mx.maximum(mx.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
        return np.array(pooled.astype(mx.float32))


def fit_window(seqs: Sequence[Sequence[int]], window: int) -> list[list[int]]:
    """Tokenized texts cut to the window, keeping each one's closing (special) token as a tokenizer's
    truncation does."""
    return [list(s[:window - 1]) + list(s[-1:]) if len(s) > window else list(s) for s in seqs]


def load_embedder(path: Path, max_batch: int = 32) -> Embedder:
    return Embedder(path, max_batch)
