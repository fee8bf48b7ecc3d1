"""q/k/v and gate/up fused into one kernel matmul each (native layout): same logits to the bit, fewer matmuls."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from gmlx_server.engine import loader
from gmlx_server.engine.arch import make_cache
from gmlx_server.engine.kernels import probe
from gmlx_server.engine.kernels.modules import FusedPart, GGUFLinear
from tests.conftest import gemma_path, smollm2_path

pytestmark = pytest.mark.slow


def _logits(lm: loader.LoadedModel) -> tuple[np.ndarray, np.ndarray]:
    cache = make_cache(lm.model)
    prefill = lm.model(mx.array([[1, 2, 3, 4, 5, 6, 7, 8]]), cache=cache).logits
    step = lm.model(mx.array([[9]]), cache=cache).logits
    return np.array(prefill), np.array(step)


@pytest.mark.parametrize("path", [smollm2_path, gemma_path], ids=["smollm2", "gemma3"])
def test_fused_projections_equal_the_separate_ones(path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    if probe().ext is None:
        pytest.skip(probe().reason)
    fused = loader.load_gguf_model(path())  # type: ignore[operator]
    monkeypatch.setattr(loader, "fuse_projections", lambda model: 0)
    plain = loader.load_gguf_model(path())  # type: ignore[operator]
    parts = [m for _, m in fused.model.named_modules() if isinstance(m, FusedPart)]
    layers = len(fused.model.model.layers)
    assert len(parts) >= 4 * layers  # at least q/k (one block type) and gate/up in every layer
    assert not any(isinstance(m, FusedPart) for _, m in plain.model.named_modules())
    mm = sum(isinstance(m, GGUFLinear) for _, m in fused.model.named_modules())
    assert mm < sum(isinstance(m, GGUFLinear) for _, m in plain.model.named_modules())
    for a, b in zip(_logits(fused), _logits(plain), strict=True):
        np.testing.assert_array_equal(a, b)
