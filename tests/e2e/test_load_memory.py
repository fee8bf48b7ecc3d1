"""Loading the dense fp32 layout transposes tensor by tensor: MLX's peak stays near the final weights.

The largest single matrix (SmolLM2's tied 49152 x 576 embedding, ~113 MB of 538) bounds the overshoot;
transposing the whole model before evaluating it peaked at 2.0x.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from gmlx_server.engine.loader import load_gguf_model
from tests.conftest import smollm2_path

pytestmark = pytest.mark.slow


def test_dense_load_peaks_near_its_final_weights() -> None:
    mx.synchronize()
    mx.clear_cache()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    lm = load_gguf_model(smollm2_path(), layout="dense")
    peak = mx.get_peak_memory() - before
    assert lm.info.weights_layout == "dense"
    assert peak <= 1.25 * lm.info.weights_bytes, f"peak {peak / 1e6:.0f} MB for {lm.info.weights_bytes / 1e6:.0f} MB"
