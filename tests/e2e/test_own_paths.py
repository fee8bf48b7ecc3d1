"""Issue 29 item 3: each model runs its own path. A model loaded with the kernels on and one with them off, in one
process, each keep their modules and their logits whatever loads after them, and no load reassigns an MLX or
mlx-vlm function (the loader swaps module instances of that model only)."""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable
from types import ModuleType
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import pytest

from gmlx_server.engine.arch import ARCHS, make_cache
from gmlx_server.engine.kernels import fast_ops
from gmlx_server.engine.kernels.heads import HeadsAttention
from gmlx_server.engine.loader import LoadedModel, load_gguf_model
from tests.conftest import smollm2_path
from tests.unit.conftest import ext

__all__ = ["ext"]  # the unit tests' fixture: the kernels, or a skip where none could be built

pytestmark = pytest.mark.slow

OURS = (fast_ops.RMSNorm, fast_ops.RoPE, fast_ops.GatedMLP, HeadsAttention)


def _bindings() -> dict[str, Any]:
    """Every function a load used to rebind, by where it lives."""
    out = {f"mx.fast.{n}": vars(mx.fast)[n] for n in ("rms_norm", "rope", "scaled_dot_product_attention")}
    out["mlx.nn.gelu_approx"] = vars(nn)["gelu_approx"]
    for home in ("activations", "mlp", "llama.language"):
        out[f"{home}.swiglu"] = vars(importlib.import_module(f"mlx_vlm.models.{home}"))["swiglu"]
    for spec in ARCHS.values():
        lang = importlib.import_module(f"mlx_vlm.models.{spec.module}.language")
        out[f"{spec.module}.attention"] = vars(lang)["scaled_dot_product_attention"]
    return out


class _Counting:
    """The extension, counting the calls of the primitives a model's modules make (the matmuls are the layout's)."""

    def __init__(self, ext: ModuleType) -> None:
        self._ext, self.calls = ext, Counter[str]()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fn = getattr(self._ext, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return fn(*args, **kwargs)
        return counted


def _logits(loaded: LoadedModel) -> mx.array:
    cache = make_cache(loaded.model)
    loaded.model(mx.array([list(range(200, 240))]), cache=cache)  # prefill (flash attention), then decode
    out = loaded.model(mx.array([[7]]), cache=cache).logits[0, -1]
    mx.eval(out)
    return out


def _kinds(loaded: LoadedModel) -> set[type]:
    return {type(m) for _, m in loaded.model.named_modules()}


def test_a_native_and_a_kernels_off_model_each_run_their_own_path(ext: ModuleType) -> None:
    before = _bindings()
    native = load_gguf_model(smollm2_path(), "on")
    assert native.kernels is not None and native.info.weights_layout == "native"
    counting = _Counting(ext)
    native.kernels.ext = counting  # type: ignore[assignment]  # the same primitives, counted
    alone = _logits(native)
    # RoPE and the fused q/k/v projection's matmul: in each layer's heads op (heads_of); the MLPs' gate and the
    # residual adds with their norms: in the projections' matmuls (GGUFLinear.gated and add_norm, on the layout's
    # own extension)
    assert {"rms_norm", "heads_of", "sdpa"} <= set(counting.calls)

    off = load_gguf_model(smollm2_path(), "off", native_kernels=False)  # GMLX_NATIVE_KERNELS=0's path
    assert off.kernels is None and off.info.weights_layout != "native"
    assert not _kinds(off) & set(OURS) and {nn.RMSNorm, nn.RoPE} <= _kinds(off)
    assert set(OURS) <= _kinds(native) and nn.RMSNorm not in _kinds(native)
    counting.calls.clear()
    off_alone = _logits(off)
    assert not counting.calls  # the kernels-off model never reaches the extension's primitives
    assert mx.array_equal(_logits(native), alone)  # the later load did not change the first model's path
    assert counting.calls["rms_norm"] > 0

    load_gguf_model(smollm2_path(), "again")  # a kernels-on load after it leaves the kernels-off model alone
    assert mx.array_equal(_logits(off), off_alone)
    assert _bindings() == before  # identity of every function: nothing reassigned by the three loads


def test_the_engine_draws_greedy_rows_with_the_models_argmax(ext: ModuleType) -> None:
    """The batch's argmax over the vocabulary (its bulk greedy rows' token) is the model's kernels primitive."""
    from gmlx_server.engine.mlx_engine import MLXEngine
    from gmlx_server.engine.types import GenerationRequest, SamplingParams, TokenEvent

    native = load_gguf_model(smollm2_path(), "on")
    assert native.kernels is not None
    counting = _Counting(ext)
    native.kernels.ext = counting  # type: ignore[assignment]
    engine = MLXEngine(lambda: native)
    try:
        events: list[TokenEvent] = []
        engine.generate_sync(GenerationRequest("g", [1, 2, 3, 4], 6, SamplingParams(temperature=0.0)), events.append)
    finally:
        engine.close()
    assert events[-1].finish_reason is not None and counting.calls["argmax"] >= 5
