"""Model geometry from GGUF metadata alone: what the KV cache and the prefill working set scale with.

Each architecture is read the way the engine builds its mlx-vlm config (gmlx_server/engine/arch.py),
so the planner and the server agree on head sizes and sliding windows:

  llama    head_dim = rope.dimension_count, else attention.key_length, else hidden / heads
  qwen2    head_dim = hidden / heads (mlx-vlm's qwen2 ignores key_length)
  qwen3    head_dim = attention.key_length, else hidden / heads
  gemma3   head_dim = attention.key_length; layer i is full attention when i % pattern == pattern - 1,
           the others keep a sliding window (attention.sliding_window, default 4096;
           attention.sliding_window_pattern, default 6), as mlx-vlm's gemma3 make_cache builds them
  other    key_length / value_length, else hidden / heads; every layer full attention

Head counts may be per-layer arrays in GGUF; they are kept per layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gmlx_plan.gguf_types import GGUFHeader

DEFAULT_CONTEXT = 4096  # the loader's default when the GGUF has no context_length
GEMMA3_WINDOW, GEMMA3_PATTERN = 4096, 6


@dataclass(frozen=True)
class LayerKV:
    """One layer's attention cache shape."""

    kv_heads: int
    key_dim: int
    value_dim: int
    window: int | None = None  # sliding-window size in tokens; None = full attention

    @property
    def kv_elements_per_token(self) -> int:
        return self.kv_heads * (self.key_dim + self.value_dim)


@dataclass(frozen=True)
class Geometry:
    architecture: str
    n_heads: int  # query heads (the widest layer's)
    hidden: int
    ffn: int
    vocab: int
    context_length: int  # the trained window from the GGUF
    layers: tuple[LayerKV, ...]

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def sliding_layers(self) -> int:
        return sum(1 for layer in self.layers if layer.window is not None)

    @property
    def q_dim(self) -> int:
        return self.n_heads * max(layer.key_dim for layer in self.layers)

    @property
    def kv_dim(self) -> int:
        return max(layer.kv_elements_per_token for layer in self.layers)


class GeometryError(ValueError):
    """The header lacks a key the geometry needs."""


def _per_layer(value: Any, n: int, key: str) -> tuple[int, ...]:
    if value is None:
        raise GeometryError(f"missing metadata key {key}")
    if isinstance(value, list | tuple):
        if len(value) != n:
            raise GeometryError(f"{key} has {len(value)} entries for {n} layers")
        return tuple(int(v) for v in value)
    return (int(value),) * n


def _scalar(value: Any, key: str) -> int:
    if value is None:
        raise GeometryError(f"missing metadata key {key}")
    return max(int(v) for v in value) if isinstance(value, list | tuple) else int(value)


def head_dims(h: GGUFHeader, hidden: int, heads: int) -> tuple[int, int]:
    """(key, value) head sizes as the engine's mlx-vlm config builds them (the module docstring's table)."""
    arch, fallback = h.architecture, hidden // heads
    key = int(h.arch_value("attention.key_length", fallback))
    if arch == "llama":
        d = int(h.arch_value("rope.dimension_count", key))
        return d, d
    if arch == "qwen2":
        return fallback, fallback
    if arch in ("qwen3", "gemma3"):
        return key, key  # mlx-vlm uses one head_dim for keys and values
    return key, int(h.arch_value("attention.value_length", key))


def _windows(h: GGUFHeader, n: int) -> tuple[int | None, ...]:
    if h.architecture != "gemma3":
        return (None,) * n
    window = int(h.arch_value("attention.sliding_window", GEMMA3_WINDOW))
    pattern = max(1, int(h.arch_value("attention.sliding_window_pattern", GEMMA3_PATTERN)))
    return tuple(None if i % pattern == pattern - 1 else window for i in range(n))


def vocab_size(h: GGUFHeader) -> int:
    for t in h.tensors:
        if t.name == "token_embd.weight":
            return int(t.shape[1]) if len(t.shape) > 1 else int(t.shape[0])
    tokens = h.metadata.get("tokenizer.ggml.tokens")
    return len(tokens) if tokens is not None else int(h.arch_value("vocab_size", 0))


def geometry_from_header(h: GGUFHeader) -> Geometry:
    """The attention and MLP shapes of a GGUF model, from its header only."""
    n = _scalar(h.arch_value("block_count"), "block_count")
    heads = _per_layer(h.arch_value("attention.head_count"), n, "attention.head_count")
    kv_heads = _per_layer(h.arch_value("attention.head_count_kv", list(heads)), n, "attention.head_count_kv")
    hidden = _scalar(h.arch_value("embedding_length"), "embedding_length")
    key_dim, value_dim = head_dims(h, hidden, max(heads))
    layers = tuple(LayerKV(kv or hq, key_dim, value_dim, w)  # kv 0 = a layer without attention: count it as MHA
                   for hq, kv, w in zip(heads, kv_heads, _windows(h, n), strict=True))
    return Geometry(
        architecture=h.architecture, n_heads=max(heads), hidden=hidden,
        ffn=_scalar(h.arch_value("feed_forward_length", 4 * hidden), "feed_forward_length"),
        vocab=vocab_size(h), context_length=int(h.arch_value("context_length", DEFAULT_CONTEXT)),
        layers=layers,
    )
