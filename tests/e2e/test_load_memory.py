"""Load memory: the dense fp32 layout transposes tensor by tensor, so MLX's peak stays near the final weights;
the native layout holds the file's blocks once.

The largest single matrix (SmolLM2's tied 49152 x 576 embedding, ~113 MB of 538) bounds the overshoot;
transposing the whole model before evaluating it peaked at 2.0x.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import mlx.core as mx
import pytest

from gmlx_plan.gguf_header import SkippedArray, read_header
from gmlx_server.engine.loader import load_gguf_model
from tests.conftest import gemma_path, smollm2_path

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


@pytest.mark.parametrize("path", [smollm2_path, gemma_path], ids=["smollm2", "gemma3"])
def test_native_load_holds_the_file_once(path: Callable[[], str]) -> None:
    """The native layout keeps GGUF blocks as stored: resident weights are the file's size, and fusing
    q/k/v and gate/up copies one group at a time (fusing them all before freeing the parts peaked at 1.4x)."""
    mx.synchronize()
    mx.clear_cache()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    lm = load_gguf_model(path(), layout="native")
    mx.synchronize()
    held, peak, size = mx.get_active_memory() - before, mx.get_peak_memory() - before, os.path.getsize(path())
    assert lm.info.weights_layout == "native"
    assert held <= 1.02 * size, f"{held / 1e6:.0f} MB held for a {size / 1e6:.0f} MB file"
    assert peak <= 1.05 * held, f"load peak {peak / 1e6:.0f} MB for {held / 1e6:.0f} MB of weights"


def test_load_drops_the_tokenizer_only_arrays_of_the_header() -> None:
    """Gemma 3's 262K tokens, scores and token types are read once to build the tokenizer and chat template,
    then held as lengths: the tokenizer's backend answers for the pieces (a drafter's list is compared with
    the file's)."""
    path = gemma_path()
    lm = load_gguf_model(path, layout="native")
    meta = lm.header.metadata
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        assert isinstance(meta[key], SkippedArray) and len(meta[key]) == lm.tokenizer.vocab_size, key
    assert [lm.tokenizer.id_to_piece(i) for i in range(lm.tokenizer.vocab_size)] == \
        read_header(path).metadata["tokenizer.ggml.tokens"]
    assert lm.tokenizer.decode(lm.tokenizer.encode("The Eiffel Tower", add_special_tokens=False)) == "The Eiffel Tower"
