"""mx.fast.rms_norm, mx.fast.rope and the MLPs' gated activations as CPU primitives of the kernels extension.

On MLX's CPU backend the first two expand into 10-20 graph ops per call (a decode step of a 30-layer model
holds ~120 of them), and every op costs ~20 us of dispatch; the activations run on one thread with a scalar
exp (~15 ns an element, a sixth of a 512-token SmolLM2 prefill). Installed process-wide while the default device is
the CPU: each call that our primitives cover (float32, the CPU, a plain offset) goes to them, any other
to MLX's own function, so Metal and other dtypes are untouched.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import mlx.core as mx

_ORIGINAL = "_gmlx_original"  # the mlx function a wrapper replaced, for uninstall and re-install
_EXT = "_gmlx_ext"  # the extension an installed wrapper calls


def _on_cpu(x: mx.array, stream: Any) -> bool:
    return x.dtype == mx.float32 and stream is None and mx.default_device() == mx.cpu


def _rms_norm(ext: ModuleType, original: Any) -> Any:
    def rms_norm(x: mx.array, weight: mx.array | None, eps: float, *, stream: Any = None) -> mx.array:
        if _on_cpu(x, stream) and x.ndim >= 1 and (weight is None or weight.shape == (x.shape[-1],)):
            return ext.rms_norm(x, weight, eps)
        return original(x, weight, eps, stream=stream)

    setattr(rms_norm, _ORIGINAL, original)
    setattr(rms_norm, _EXT, ext)
    return rms_norm


def _rope_covered(a: mx.array, dims: int, base: float | None, offset: Any, freqs: mx.array | None) -> bool:
    if a.ndim < 3 or dims % 2 or not 0 < dims <= a.shape[-1] or (base is None) == (freqs is None):
        return False
    if freqs is not None and freqs.shape != (dims // 2,):
        return False
    return isinstance(offset, int) or (isinstance(offset, mx.array) and (
        offset.size == 1 or offset.shape == (a.shape[0],)))


def _rope(ext: ModuleType, original: Any) -> Any:
    def rope(a: mx.array, dims: int, *, traditional: bool, base: float | None, scale: float, offset: Any,
             freqs: mx.array | None = None, stream: Any = None) -> mx.array:
        if _on_cpu(a, stream) and _rope_covered(a, dims, base, offset, freqs):
            if isinstance(offset, mx.array) and offset.ndim > 1:
                offset = offset.reshape(-1)
            return ext.rope(a, dims, traditional=traditional, base=base,
                            scale=scale, offset=offset, freqs=freqs)
        return original(a, dims, traditional=traditional, base=base, scale=scale,
                        offset=offset, freqs=freqs, stream=stream)

    setattr(rope, _ORIGINAL, original)
    return rope


def _swiglu(ext: ModuleType, original: Any) -> Any:
    def swiglu(gate: mx.array, x: mx.array) -> mx.array:
        if _on_cpu(gate, None) and x.dtype == mx.float32 and x.shape == gate.shape:
            return ext.gated(gate, x, 0)
        return original(gate, x)

    setattr(swiglu, _ORIGINAL, original)
    return swiglu


def _gelu_approx(ext: ModuleType, original: Any) -> Any:
    def gelu_approx(x: mx.array) -> mx.array:
        return ext.gated(x, None, 1) if _on_cpu(x, None) else original(x)

    setattr(gelu_approx, _ORIGINAL, original)
    return gelu_approx


# Where the gated activations are looked up at call time: mlx-vlm's SwiGLU MLPs bound `swiglu` at import
# (llama's own MLP and the shared one of qwen2/qwen3); Gemma 3 calls `nn.gelu_approx`.
_ACTIVATIONS = (("mlx_vlm.models.mlp", "swiglu", _swiglu), ("mlx_vlm.models.llama.language", "swiglu", _swiglu),
                ("mlx.nn", "gelu_approx", _gelu_approx))


def install(ext: ModuleType) -> None:
    """Route mx.fast.rms_norm/rope and the MLPs' gated activations through the extension (idempotent)."""
    fast: Any = mx.fast
    fast.rms_norm = _rms_norm(ext, getattr(fast.rms_norm, _ORIGINAL, fast.rms_norm))
    fast.rope = _rope(ext, getattr(fast.rope, _ORIGINAL, fast.rope))
    for module, name, wrap in _ACTIVATIONS:
        home, current = _activation(module, name)
        setattr(home, name, wrap(ext, getattr(current, _ORIGINAL, current)))


def uninstall() -> None:
    fast: Any = mx.fast
    fast.rms_norm = getattr(fast.rms_norm, _ORIGINAL, fast.rms_norm)
    fast.rope = getattr(fast.rope, _ORIGINAL, fast.rope)
    for module, name, _ in _ACTIVATIONS:
        home, current = _activation(module, name)
        setattr(home, name, getattr(current, _ORIGINAL, current))


def _activation(module: str, name: str) -> tuple[Any, Any]:
    home = importlib.import_module(module)
    return home, getattr(home, name)


def installed() -> bool:
    return hasattr(mx.fast.rms_norm, _ORIGINAL)


def active() -> ModuleType | None:
    """The extension while installed: other CPU paths (attention) use its primitives then too."""
    ext: ModuleType | None = getattr(mx.fast.rms_norm, _EXT, None)
    return ext
