"""mx.fast.rms_norm, mx.fast.rope and the MLPs' gated activations as CPU primitives of the kernels extension.

On MLX's CPU backend the first two expand into 10-20 graph ops per call (a decode step of a 30-layer model
holds ~120 of them), and every op costs ~20 us of dispatch; the activations run on one thread with a scalar
exp (~15 ns an element, a sixth of a 512-token SmolLM2 prefill). Installed process-wide while the default device is
the CPU: each call that our primitives cover (float32, the CPU, a plain offset) goes to them, any other
to MLX's own function, so Metal and other dtypes are untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import mlx.core as mx

from gmlx_server.engine import mlx_adapter, vlm_adapter

Fn = Callable[..., Any]


def _on_cpu(x: mx.array, stream: Any) -> bool:
    return x.dtype == mx.float32 and stream is None and mx.default_device() == mx.cpu


@dataclass(frozen=True)
class Routed:
    """An installed wrapper: the extension it calls and the function it replaced (restored by uninstall)."""

    ext: ModuleType
    original: Fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # each kind's own signature
        raise NotImplementedError


class _RmsNorm(Routed):
    def __call__(self, x: mx.array, weight: mx.array | None, eps: float, *, stream: Any = None) -> mx.array:
        if _on_cpu(x, stream) and x.ndim >= 1 and (weight is None or weight.shape == (x.shape[-1],)):
            out: mx.array = self.ext.rms_norm(x, weight, eps)
            return out
        mlx_own: mx.array = self.original(x, weight, eps, stream=stream)
        return mlx_own


def _rope_covered(a: mx.array, dims: int, base: float | None, offset: Any, freqs: mx.array | None) -> bool:
    if a.ndim < 3 or dims % 2 or not 0 < dims <= a.shape[-1] or (base is None) == (freqs is None):
        return False
    if freqs is not None and freqs.shape != (dims // 2,):
        return False
    return isinstance(offset, int) or (isinstance(offset, mx.array) and (
        offset.size == 1 or offset.shape == (a.shape[0],)))


class _Rope(Routed):
    def __call__(self, a: mx.array, dims: int, *, traditional: bool, base: float | None, scale: float,
                 offset: Any, freqs: mx.array | None = None, stream: Any = None) -> mx.array:
        if _on_cpu(a, stream) and _rope_covered(a, dims, base, offset, freqs):
            if isinstance(offset, mx.array) and offset.ndim > 1:
                offset = offset.reshape(-1)
            out: mx.array = self.ext.rope(a, dims, traditional=traditional, base=base,
                                          scale=scale, offset=offset, freqs=freqs)
            return out
        mlx_own: mx.array = self.original(a, dims, traditional=traditional, base=base, scale=scale,
                                          offset=offset, freqs=freqs, stream=stream)
        return mlx_own


class _Swiglu(Routed):
    def __call__(self, gate: mx.array, x: mx.array) -> mx.array:
        if _on_cpu(gate, None) and x.dtype == mx.float32 and x.shape == gate.shape:
            out: mx.array = self.ext.gated(gate, x, 0)
            return out
        mlx_own: mx.array = self.original(gate, x)
        return mlx_own


class _GeluApprox(Routed):
    def __call__(self, x: mx.array) -> mx.array:
        out: mx.array = self.ext.gated(x, None, 1) if _on_cpu(x, None) else self.original(x)
        return out


@dataclass(frozen=True)
class _Site:
    """One function install replaces: where it lives ("mlx.fast", "mlx.nn" or a module under mlx_vlm.models)."""

    home: str
    name: str
    kind: type[Routed]

    def current(self) -> Fn:
        if self.home == "mlx.fast":
            return mlx_adapter.fast_function(self.name)
        if self.home == "mlx.nn":
            return mlx_adapter.nn_function(self.name)
        fn = vlm_adapter.models_function(self.home, self.name)
        if fn is None:
            raise LookupError(f"mlx_vlm.models.{self.home} has no {self.name}: the installed mlx-vlm moved it")
        return fn

    def bind(self, fn: Fn) -> None:
        if self.home == "mlx.fast":
            mlx_adapter.set_fast_function(self.name, fn)
        elif self.home == "mlx.nn":
            mlx_adapter.set_nn_function(self.name, fn)
        else:
            vlm_adapter.set_models_function(self.home, self.name, fn)


# mlx-vlm's SwiGLU MLPs bound `swiglu` at import (llama's own MLP and the shared one of qwen2/qwen3), so it is
# rebound where they look it up; Gemma 3 calls `nn.gelu_approx`.
_SITES = (_Site("mlx.fast", "rms_norm", _RmsNorm), _Site("mlx.fast", "rope", _Rope),
          _Site("mlp", "swiglu", _Swiglu), _Site("llama.language", "swiglu", _Swiglu),
          _Site("mlx.nn", "gelu_approx", _GeluApprox))


def install(ext: ModuleType) -> None:
    """Route mx.fast.rms_norm/rope and the MLPs' gated activations through the extension (idempotent)."""
    for site in _SITES:
        current = site.current()
        site.bind(site.kind(ext, current.original if isinstance(current, Routed) else current))


def uninstall() -> None:
    for site in _SITES:
        current = site.current()
        if isinstance(current, Routed):
            site.bind(current.original)


def installed() -> bool:
    return isinstance(mlx_adapter.fast_function("rms_norm"), Routed)


def active() -> ModuleType | None:
    """The extension while installed: other CPU paths (attention) use its primitives then too."""
    current = mlx_adapter.fast_function("rms_norm")
    return current.ext if isinstance(current, Routed) else None
