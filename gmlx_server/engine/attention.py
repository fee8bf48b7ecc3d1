"""Attention for MLX's CPU backend, called by one model's attention modules in place of mx.fast's.

On mlx[cpu], mx.fast.scaled_dot_product_attention materializes the scores and spends most of its time
in exp (MLX's CPU exp costs ~28 ns an element, glibc's powf ~9 ns) and in broadcasting K for GQA.
Here GQA is folded into the matmul rows (each KV head is read once) and the softmax is 2**(s - max)
on scores already in log2 units, normalized after the PV product. bench/attention.py has the figures.
Metal keeps mx.fast's fused kernel: cpu_attention serves only when the default device is the CPU. A kvarn
KV cache (engine/kv_quant.py) goes to kvarn_attention on any device. use_gmlx_attention gives a loaded model's
Attention instances a subclass that calls gmlx's; mlx-vlm's own function stays as it is for every other model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from gmlx_server.engine import vlm_adapter
from gmlx_server.engine.kernels.fast_ops import MLX_OPS, Primitives
from gmlx_server.engine.kv_quant import is_kvarn, kvarn_attention

_LOG2E = math.log2(math.e)
FEW_ROWS = 8  # up to this many queries (decode, speculative verification) one kernel call beats a dozen ops
FLASH_WIDTH = 16  # beyond FEW_ROWS the kernels' blockwise path takes value rows of a multiple of this width
KV_DTYPES = (mx.float32, mx.float16)  # what the caches hold (kv_dtype): the kernels read either as stored


def cpu_attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask: Any,
                  prims: Primitives = MLX_OPS, flat: bool = False, length: int | None = None) -> mx.array:
    """softmax(scale * q k^T + mask) v for q (B, H, L, D), k/v (B, Hk, S, D); mask None, "causal" or an array.
    The kernels' one-op attention where `prims` has the extension, else MLX's ops (whose matmuls promote a float16
    cache to the queries' float32). flat: (B, L, H * Dv), each position's heads side by side (as_flat).
    length: S is the first `length` rows of keys and values (a KV cache's buffers, read without a slice op)."""
    L = queries.shape[2]
    ours = queries.dtype == mx.float32 and keys.dtype == values.dtype and keys.dtype in KV_DTYPES
    ext = prims.ext if ours and (L <= FEW_ROWS or values.shape[-1] % FLASH_WIDTH == 0) else None
    if ext is not None:  # the CPU kernels' one-op attention: row by row, or blockwise (flash) for prefill
        out: mx.array = ext.sdpa(queries, keys, values, scale, None if isinstance(mask, str) else mask,
                                 causal=mask == "causal", flat=flat, keys=-1 if length is None else length)
        return out
    keys, values = prefix(keys, length), prefix(values, length)
    heads = _mlx_attention(queries, keys, values, scale, mask)
    return as_flat(heads) if flat else heads


def prefix(rows: Any, length: int | None) -> Any:
    """A KV buffer's first `length` rows (axis 2); all of it when length is None."""
    return rows if length is None else rows[..., :length, :]


def as_flat(out: mx.array) -> mx.array:
    """(B, H, L, Dv) attention output -> (B, L, H * Dv), what an output projection reads."""
    B, _, L, _ = out.shape
    return out.transpose(0, 2, 1, 3).reshape(B, L, -1)


def _mlx_attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask: Any) -> mx.array:
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
    """fp32 queries over fp32 or float16 plain arrays with a mask we can place; quantized caches, sinks and other
    dtypes keep mlx-vlm's path."""
    quantized = vlm_adapter.quantized_cache(cache) or is_kvarn(cache)
    if sinks is not None or quantized or not isinstance(keys, mx.array):
        return False
    if queries.dtype != mx.float32 or keys.dtype not in KV_DTYPES or queries.shape[1] % keys.shape[1]:
        return False
    if mask is None or isinstance(mask, str):
        return mask in (None, "causal")
    if not isinstance(mask, mx.array):
        return False
    return mask.ndim <= 2 or (mask.ndim == 4 and mask.shape[1] in (1, queries.shape[1]))


@dataclass(frozen=True)
class _RoutedAttention:
    """One model's attention: the family's function, whether plain fp32 attention goes to cpu_attention (the
    model runs on the CPU device), and the primitives cpu_attention may call."""

    original: Any
    cpu: bool
    prims: Primitives

    def __call__(self, queries: mx.array, keys: Any, values: Any, cache: Any, scale: float, mask: Any,
                 sinks: Any = None, flat: bool = False, length: int | None = None) -> mx.array:
        """flat (gmlx's own callers): the output as (B, L, H * Dv) rather than (B, H, L, Dv); length: attend to
        the first `length` rows of keys and values (a cache's buffers, kv_append)."""
        if self.cpu and supported(queries, keys, cache, mask, sinks):
            return cpu_attention(queries, keys, values, scale, mask, self.prims, flat, length)
        keys, values = prefix(keys, length), prefix(values, length)
        out = self._elsewhere(queries, keys, values, cache, scale, mask, sinks)
        return as_flat(out) if flat else out

    def _elsewhere(self, queries: mx.array, keys: Any, values: Any, cache: Any, scale: float, mask: Any,
                   sinks: Any) -> mx.array:
        if is_kvarn(cache) and sinks is None:  # mlx-vlm has no attention over a kvarn cache: ours, on any device
            return kvarn_attention(queries, keys, values, cache, scale, mask)
        if isinstance(keys, mx.array) and keys.dtype != queries.dtype:  # a float16 cache under fp32 queries (Metal)
            keys, values = keys.astype(queries.dtype), values.astype(queries.dtype)
        out: mx.array = self.original(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)
        return out


def use_gmlx_attention(model: Any, cpu: bool, prims: Primitives = MLX_OPS) -> int:
    """Route this model's attention modules through gmlx's: kvarn caches always, and plain fp32 ones to
    cpu_attention when `cpu` (the model runs on the CPU device). Returns how many modules now do."""
    own: dict[type, type] = {}
    attentions = [m for _, m in model.named_modules() if vlm_adapter.calls_attention(type(m))]
    for m in attentions:
        cls = type(m)
        if cls not in own:
            own[cls] = vlm_adapter.with_attention(cls, _RoutedAttention(vlm_adapter.family_attention(cls), cpu, prims))
        vlm_adapter.recast(m, own[cls])
    return len(attentions)
