"""Attention for MLX's CPU backend, installed in place of mx.fast's where the model runs on the CPU.

On mlx[cpu], mx.fast.scaled_dot_product_attention materializes the scores and spends most of its time
in exp (MLX's CPU exp costs ~28 ns an element, glibc's powf ~9 ns) and in broadcasting K for GQA.
Here GQA is folded into the matmul rows (each KV head is read once) and the softmax is 2**(s - max)
on scores already in log2 units, normalized after the PV product. bench/attention.py has the figures.
Metal keeps mx.fast's fused kernel: the loader installs this only when the default device is the CPU.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import mlx.core as mx

_LOG2E = math.log2(math.e)
_ORIGINAL = "_gmlx_original_sdpa"  # where the module's own function is kept while ours is installed


def cpu_attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask: Any) -> mx.array:
    """softmax(scale * q k^T + mask) v for q (B, H, L, D), k/v (B, Hk, S, D); mask None, "causal" or an array."""
    B, H, L, D = queries.shape
    Hk, S = keys.shape[1], keys.shape[2]
    r = H // Hk
    # The r query heads that share a KV head become r*L rows of one matmul: K is not repeated.
    q = (queries * (scale * _LOG2E)).reshape(B, Hk, r * L, D)
    s = (q @ keys.swapaxes(-1, -2)).reshape(B, Hk, r, L, S)
    s = _apply_mask(s, mask, L, S)
    e = mx.power(mx.array(2.0, s.dtype), s - s.max(axis=-1, keepdims=True))
    e = e.reshape(B, Hk, r * L, S)
    # Dividing the (rows, D) product rather than the (rows, S) weights saves a pass over the scores.
    out = (e @ values) / e.sum(axis=-1, keepdims=True)
    return out.reshape(B, H, L, values.shape[-1])


def _apply_mask(s: mx.array, mask: Any, L: int, S: int) -> mx.array:
    if mask is None:
        return s
    if isinstance(mask, str):  # "causal": the L queries are the last L positions of the S keys
        mask = mx.arange(S - L, S)[:, None] >= mx.arange(S)[None]
    elif mask.ndim == 4:  # (B, 1 or H, L, S) -> (B, 1 or Hk, 1 or r, L, S)
        b, h = mask.shape[:2]
        mask = mask[:, :, None] if h == 1 else mask.reshape(b, s.shape[1], s.shape[2], *mask.shape[2:])
    if mask.dtype == mx.bool_:
        # finfo.min, not -inf, as mx.fast: a row masked throughout averages instead of turning NaN.
        return mx.where(mask, s, mx.array(mx.finfo(s.dtype).min, s.dtype))
    return s + mask.astype(s.dtype) * _LOG2E  # an additive mask is in natural-log units


def supported(queries: mx.array, keys: Any, cache: Any, mask: Any, sinks: Any) -> bool:
    """fp32 plain arrays with a mask we can place; quantized caches, sinks and other dtypes keep mlx-vlm's path."""
    if sinks is not None or hasattr(cache, "bits") or not isinstance(keys, mx.array):
        return False
    if queries.dtype != mx.float32 or keys.dtype != mx.float32 or queries.shape[1] % keys.shape[1]:
        return False
    if mask is None or isinstance(mask, str):
        return mask in (None, "causal")
    if not isinstance(mask, mx.array):
        return False
    return mask.ndim <= 2 or (mask.ndim == 4 and mask.shape[1] in (1, queries.shape[1]))


def _sdpa(original: Any) -> Any:
    def scaled_dot_product_attention(queries: mx.array, keys: Any, values: Any, cache: Any, scale: float,
                                     mask: Any, sinks: Any = None) -> mx.array:
        if supported(queries, keys, cache, mask, sinks):
            return cpu_attention(queries, keys, values, scale, mask)
        return original(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)

    setattr(scaled_dot_product_attention, _ORIGINAL, original)
    return scaled_dot_product_attention


def install_cpu_attention(module: str, enabled: bool = True) -> None:
    """Point mlx_vlm.models.<module>.language's attention at cpu_attention (or back at its own, enabled=False)."""
    lang: Any = importlib.import_module(f"mlx_vlm.models.{module}.language")
    current = lang.scaled_dot_product_attention
    original = getattr(current, _ORIGINAL, current)
    lang.scaled_dot_product_attention = _sdpa(original) if enabled else original


def cpu_attention_installed(module: str) -> bool:
    lang = importlib.import_module(f"mlx_vlm.models.{module}.language")
    return hasattr(lang.scaled_dot_product_attention, _ORIGINAL)
