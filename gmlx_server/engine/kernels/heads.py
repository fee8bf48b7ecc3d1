"""Attention layers whose q, k and v heads come from one CPU primitive (the extension's GKHeads).

mlx-vlm's Attention forward splits the q/k/v projections into heads with a slice, a reshape and a transpose each,
normalizes q and k (Gemma 3, Qwen 3), rotates them, and the float16 KV cache casts k and v: about fourteen graph
ops a layer, each costing a decode step more in dispatch than in work. HeadsAttention does all of it in one op
and then calls the layer's own cache, attention function and output projection, so the results are the same to
the bit. Any call the primitive does not cover (a quantized or kvarn cache, YaRN's pre-scaled RoPE, a dtype other
than float32) runs the layer's own forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from gmlx_server.engine import kv_append, vlm_adapter
from gmlx_server.engine.kernels.fast_ops import Primitives, RMSNorm, RoPE, RopeArgs
from gmlx_server.engine.kernels.modules import FusedGGUFLinear, FusedPart, GGUFLinear, Projected, float_bias
from gmlx_server.engine.kv_half import stores_half
from gmlx_server.engine.mlx_adapter import child, replace_module, set_child

_CACHES = ("KVCache", "BatchKVCache", "RotatingKVCache", "BatchRotatingKVCache")  # mlx-vlm's plain caches


def _source(proj: FusedPart | GGUFLinear, x: mx.array) -> tuple[mx.array, int]:
    """A GGUF projection's output and the column its part starts at, without slicing (_covers chose the layer)."""
    return proj.source(x) if isinstance(proj, FusedPart) else (proj(x), 0)


_PLAIN: dict[type, bool] = {}  # cache class -> one of mlx-vlm's plain caches (or a subclass), looked up per step


def _width(proj: Any) -> int | None:
    """A GGUF projection's output width; None for any other module (a float matrix loads as a dense Linear)."""
    if isinstance(proj, FusedPart):
        return proj.width
    return int(proj.weight.shape[0]) if isinstance(proj, GGUFLinear) else None


def _covers(layer: nn.Module) -> bool:
    """A plain_attention layer whose q/k/v projections are GGUF blocks, the sources GKHeads reads."""
    return vlm_adapter.plain_attention(layer) and all(_width(child(layer, n)) for n in ("q_proj", "k_proj", "v_proj"))


def _plain_cache(cache: Any) -> bool:
    if cache is None:
        return True
    kind = type(cache)
    if kind not in _PLAIN:
        _PLAIN[kind] = any(c.__name__ in _CACHES and c.__module__.startswith("mlx_vlm.") for c in kind.__mro__)
    return _PLAIN[kind]


@dataclass(frozen=True)
class _Parts:
    """The layer's pieces GKHeads reads, looked up once at load: a step calls every layer, and each Module
    lookup costs Python. A plain object, so the module tree does not take it for children."""

    projections: tuple[Any, ...]
    q_norm: RMSNorm | None
    k_norm: RMSNorm | None
    rope: RopeArgs
    whole: tuple[FusedGGUFLinear, list[int]] | None  # one fused projection of q, k and v, and where each starts


def _one_projection(projections: tuple[Any, ...]) -> tuple[FusedGGUFLinear, list[int]] | None:
    """The fused projection q, k and v are all parts of (GKHeads then computes its matmul), and each's column."""
    if not all(isinstance(p, FusedPart) for p in projections):
        return None
    fused = projections[0].projection()
    if any(p.projection() is not fused for p in projections) or not float_bias(fused):
        return None
    return fused, [p.start for p in projections]


class HeadsAttention(nn.Module):
    """A plain_attention layer (vlm_adapter) with its children under their own names, so parameter paths stay."""

    def __init__(self, layer: nn.Module, prims: Primitives) -> None:
        super().__init__()
        for name in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm", "rope"):
            if (m := child(layer, name)) is not None:
                set_child(self, name, m)
        self._layer = lambda: layer  # not a child: its parameters are these
        self._attend = vlm_adapter.family_attention(type(layer))
        self._prims, self.scale = prims, float(layer.scale)
        self.n_heads, self.n_kv_heads = vlm_adapter.attention_heads(layer)
        self.head_dim = (_width(self["q_proj"]) or 0) // self.n_heads
        rope, norms = self["rope"], self._norms()
        o_proj = self["o_proj"]
        self._o_rides = isinstance(o_proj, GGUFLinear) and float_bias(o_proj)  # a flag: the module is a child
        self._parts: _Parts | None = None  # fixed at load: None where the primitive never covers this layer
        if isinstance(rope, RoPE) and rope.plain() and norms is not None:
            projections = tuple(self[n] for n in ("q_proj", "k_proj", "v_proj"))
            self._parts = _Parts(projections, norms[0], norms[1], rope.args, _one_projection(projections))

    def _norms(self) -> tuple[RMSNorm | None, RMSNorm | None] | None:
        qn, kn = child(self, "q_norm"), child(self, "k_norm")
        if qn is None and kn is None:
            return None, None
        return (qn, kn) if isinstance(qn, RMSNorm) and isinstance(kn, RMSNorm) and qn.eps == kn.eps else None

    def _heads(self, x: mx.array, cache: Any) -> list[mx.array] | None:
        """q, k and v from the primitive; None where it does not cover this call."""
        ext, parts = self._prims.covering(x), self._parts
        if ext is None or parts is None or not _plain_cache(cache):
            return None
        a, qn, kn = parts.rope, parts.q_norm, parts.k_norm
        spec = {"dims": a.dims, "traditional": a.traditional, "base": a.base, "scale": a.scale,
                "offset": _offset(cache), "freqs": a.freqs, "q_norm": qn["weight"] if qn else None,
                "k_norm": kn["weight"] if kn else None, "eps": qn.eps if qn else 0.0, "half_kv": stores_half(cache)}
        out: list[mx.array]
        if parts.whole is not None:  # the projection's matmul in the heads op: one node fewer
            fused, cols = parts.whole
            out = ext.heads_of(x, fused["weight"], fused.qtype, fused.in_dims, fused.get("bias"), cols, self.n_heads,
                               self.n_kv_heads, self.head_dim, **spec)
            return out
        arrays = [_source(p, x) for p in parts.projections]  # float32, as x is (covering)
        out = ext.heads([s[0] for s in arrays], [s[1] for s in arrays], self.n_heads, self.n_kv_heads, self.head_dim,
                        **spec)
        return out

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        out = self.projected(x, mask, cache)
        return out() if isinstance(out, Projected) else out

    def projected(self, x: mx.array, mask: Any = None, cache: Any = None) -> Projected | mx.array:
        """The output, or where the primitive covered the call and o_proj can take an epilogue, the attention's
        rows still to be projected (Projected)."""
        heads = self._heads(x, cache)
        if heads is None:
            own: mx.array = self._layer()(x, mask, cache)
            return own
        q, k, v = heads
        length = None  # attention reads all of k and v, or the first `length` rows of the cache's buffers
        appended = kv_append.append(cache, k, v) if cache is not None else None
        if appended is not None:
            k, v, length = appended
        elif cache is not None:
            k, v = cache.update_and_fetch(k, v)
        keys = k.shape[2] if length is None else length
        if isinstance(mask, mx.array) and mask.shape[-1] != keys:  # a sliding layer's keys (Gemma 3)
            mask = mask[..., -keys:]
        y: mx.array = self._attend(q, k, v, cache, scale=self.scale, mask=mask, flat=True, length=length)
        if self._o_rides:
            return Projected(self["o_proj"], y)
        out: mx.array = self["o_proj"](y)
        return out


def _offset(cache: Any) -> Any:
    if cache is None:
        return 0
    off = cache.offset
    return off.reshape(-1) if isinstance(off, mx.array) and off.ndim > 1 else off


def use_heads_attention(model: nn.Module, prims: Primitives) -> int:
    """Swap `model`'s plain attention layers (after use_gmlx_attention) whose projections are GGUF blocks for
    HeadsAttention; returns how many."""
    swaps = [(path, HeadsAttention(m, prims)) for path, m in model.named_modules() if path and _covers(m)]
    for path, new in swaps:
        replace_module(model, path, new)
    return len(swaps)
