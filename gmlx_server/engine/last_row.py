"""The output head over the last position only, for a forward pass whose other positions only fill the KV cache.

Every text model here ends in `model.norm` followed by the head (`lm_head` or the tied embedding), and MLX does
not push a later `[:, -1]` slice back through a matmul: a 512-token prompt chunk would multiply Gemma 3's
262,144-row head 512 times to keep one row of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from gmlx_server.engine.vlm_adapter import final_norm, set_final_norm


class _LastRow(nn.Module):
    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def __call__(self, x: mx.array) -> mx.array:
        return self.norm(x[:, -1:])


@contextmanager
def last_row_only(model: Any) -> Iterator[None]:
    """While the graph of one call is built, the final norm (so the head) sees only the last position.

    MLX builds the graph at call time, so restoring the norm right after the call is safe; a model without
    `model.norm` is called unchanged.
    """
    norm = final_norm(model)
    if not isinstance(norm, nn.Module):
        yield
        return
    set_final_norm(model, _LastRow(norm))
    try:
        yield
    finally:
        set_final_norm(model, norm)
