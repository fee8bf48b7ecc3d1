"""mx.fast.rms_norm and mx.fast.rope as single CPU primitives of the kernels extension.

On MLX's CPU backend both expand into 10-20 graph ops per call (a decode step of a 30-layer model holds
~120 of them), and every op costs ~20 us of dispatch. Installed process-wide while the default device is
the CPU: each call that our primitives cover (float32, the CPU, a plain offset) goes to them, any other
to MLX's own function, so Metal and other dtypes are untouched.
"""

from __future__ import annotations

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


def install(ext: ModuleType) -> None:
    """Route mx.fast.rms_norm/rope through the extension (idempotent)."""
    fast: Any = mx.fast
    fast.rms_norm = _rms_norm(ext, getattr(fast.rms_norm, _ORIGINAL, fast.rms_norm))
    fast.rope = _rope(ext, getattr(fast.rope, _ORIGINAL, fast.rope))


def uninstall() -> None:
    fast: Any = mx.fast
    fast.rms_norm = getattr(fast.rms_norm, _ORIGINAL, fast.rms_norm)
    fast.rope = getattr(fast.rope, _ORIGINAL, fast.rope)


def installed() -> bool:
    return hasattr(mx.fast.rms_norm, _ORIGINAL)


def active() -> ModuleType | None:
    """The extension while installed: other CPU paths (attention) use its primitives then too."""
    ext: ModuleType | None = getattr(mx.fast.rms_norm, _EXT, None)
    return ext
