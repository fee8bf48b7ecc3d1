"""A prompt's final chunk runs the output head on its last position only, with the same next-token logits."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from gmlx_server.engine.arch import make_cache
from gmlx_server.engine.last_row import last_row_only
from gmlx_server.engine.loader import load_gguf_model
from tests.conftest import gemma_path, native_kernels, smollm2_path

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("path", [smollm2_path, gemma_path], ids=["smollm2", "gemma3"])
def test_last_row_logits_equal_the_full_passes_last_row(path: object) -> None:
    loaded = load_gguf_model(path(), "m", native_kernels=native_kernels())  # type: ignore[operator]
    model, norm = loaded.model, loaded.model.model.norm
    ids = mx.array([list(range(100, 160))], dtype=mx.int32)
    full = model(ids, cache=make_cache(model)).logits
    with last_row_only(model):
        last = model(ids, cache=make_cache(model)).logits
    assert model.model.norm is norm  # restored once the graph is built
    assert full.shape[1] == 60 and last.shape[1] == 1  # the head multiplied one row
    a, b = np.array(full[0, -1]), np.array(last[0, -1])
    assert int(a.argmax()) == int(b.argmax())
    assert float(np.abs(a - b).max()) < 0.05  # one row may take the few-row kernel, the full pass sgemm


def test_the_norm_comes_back_when_the_call_raises() -> None:
    norm = nn.RMSNorm(4)
    model = SimpleNamespace(model=nn.Module())
    model.model.norm = norm
    with pytest.raises(RuntimeError), last_row_only(model):
        assert model.model.norm is not norm
        assert model.model.norm(mx.ones((1, 3, 4))).shape == (1, 1, 4)
        raise RuntimeError("the forward pass failed")
    assert model.model.norm is norm


def test_a_model_without_a_final_norm_is_called_unchanged() -> None:
    plain = SimpleNamespace(model=SimpleNamespace(norm=mx.array([1.0])))
    with last_row_only(plain):
        assert isinstance(plain.model.norm, mx.array)
    with last_row_only(object()):
        pass
