"""Continuous batching: every decoding request advances one token per step in one batched forward.

A request prefills alone into its own cache (exact, and chunked so it never stalls the batch for
long), then joins the batch by merging that cache into mlx-vlm's left-padded batch caches; a
finished request leaves by filtering its row out. Weights are read once per step for all rows,
which is where batching pays on a memory-bound CPU.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_vlm.models.cache import BatchKVCache, BatchRotatingKVCache, KVCache, RotatingKVCache

from gmlx_server.engine.generate import Sequence
from gmlx_server.engine.sampling import Draw


def _as_batch(cache: Any) -> Any:
    """A single-row cache from prefill -> the batch cache type that can extend/filter rows."""
    if isinstance(cache, RotatingKVCache):
        return BatchRotatingKVCache.merge([cache])
    if isinstance(cache, KVCache):
        return BatchKVCache.merge([cache])
    raise TypeError(f"cannot batch a {type(cache).__name__}")


class BatchDecoder:
    def __init__(self, model: Any) -> None:
        self.model = model
        self.rows: list[Sequence] = []
        self._cache: list[Any] = []

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, seq: Sequence) -> None:
        assert seq.cache is not None and seq.prefilled
        merged = [_as_batch(c) for c in seq.cache]
        if not self.rows:
            self._cache = merged
        else:
            for mine, theirs in zip(self._cache, merged, strict=True):
                mine.extend(theirs)
        seq.cache = None  # the batch owns its KV now
        self.rows.append(seq)

    def step(self) -> None:
        """One token for every row; rows that finish leave the batch."""
        tokens = mx.array([[s.next_input] for s in self.rows], dtype=mx.int32)
        logits = self.model(tokens, cache=self._cache).logits[:, -1, :]
        forced = [s.forced_next() for s in self.rows]
        draws: list[Draw | None] = [None if f is not None else s.draw(logits[i: i + 1])
                                    for i, (s, f) in enumerate(zip(self.rows, forced, strict=True))]
        pending = [d.token for d in draws if d is not None]
        mx.eval(pending if pending else [c.state for c in self._cache])
        done = [s.accept(d, f) for s, d, f in zip(self.rows, draws, forced, strict=True)]
        self._drop([i for i, d in enumerate(done) if d])

    def fail_all(self, error: str) -> None:
        for s in self.rows:
            s.finish("error", error=error)
        self._drop(list(range(len(self.rows))))

    def cancel_requested(self) -> None:
        """Rows whose client went away leave now, not at their next token."""
        gone = [i for i, s in enumerate(self.rows) if s.cancelled()]
        for i in gone:
            self.rows[i].finish("cancelled")
        self._drop(gone)

    def shed(self, index: int, error: str) -> None:
        self.rows[index].finish("shed", error=error)
        self._drop([index])

    def _drop(self, indices: list[int]) -> None:
        if not indices:
            return
        keep = [i for i in range(len(self.rows)) if i not in set(indices)]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self._cache = []
            return
        idx = mx.array(keep, dtype=mx.int32)
        for c in self._cache:
            c.filter(idx)
