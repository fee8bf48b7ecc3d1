"""Decoder layers whose residual adds run fused with the norm that follows each (the extension's GKAddNorm).

A pre-norm layer (Llama, Qwen 2/3) adds its attention's output to the residual and norms the sum for the MLP,
then adds the MLP's output and the next layer norms that sum: four ops of little work, each a dispatch on MLX's
CPU backend. Here each add and its norm are one op, and the second norm (the next layer's input norm, or the
final norm after the last layer) is handed to that norm module with the array it is of (RMSNorm.expect), so
the next layer's call returns it instead of dispatching again. Gemma 3's sandwich layer also norms each
sublayer's output before its add: one op again. The results are the separate ops' to the bit (rows.h's
norm_row). A call the kernels do not cover (not float32, not on the CPU device) runs the family's forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from gmlx_server.engine import vlm_adapter
from gmlx_server.engine.kernels.fast_ops import Primitives, RMSNorm


@dataclass(frozen=True)
class _Links:
    """What a fused layer's forward reads beside its children, fixed at load: the norms its adds fuse, in the order
    the forward applies them, and the norm its output goes to next (the last of them). A plain object, so the
    module tree does not take these norms for children."""

    prims: Primitives
    norms: tuple[RMSNorm, ...]


def _family_forward(layer: nn.Module, x: mx.array, mask: Any, cache: Any) -> mx.array:
    out: mx.array = type(layer).__bases__[0].__call__(layer, x, mask, cache)
    return out


def _pre_norm(self: Any, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
    links: _Links = self._gmlx_links
    ext = links.prims.covering(x)
    if ext is None:
        return _family_forward(self, x, mask, cache)
    post, after = links.norms
    h, normed = ext.add_norm(x, self.self_attn(self.input_layernorm(x), mask, cache), None, post.weight, post.eps)
    out, ahead = ext.add_norm(h, self.mlp(normed), None, after.weight, after.eps)
    after.expect(out, ahead)
    return out


def _sandwich(self: Any, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
    """Gemma 3's layer in float32, where its clip_residual is a plain add."""
    links: _Links = self._gmlx_links
    ext = links.prims.covering(x)
    if ext is None:
        return _family_forward(self, x, mask, cache)
    post_attn, pre_mlp, post_mlp, after = links.norms
    r = self.self_attn(self.input_layernorm(x), mask, cache)
    h, normed = ext.add_norm(x, r, post_attn.weight, pre_mlp.weight, pre_mlp.eps, post_attn.eps)
    out, ahead = ext.add_norm(h, self.mlp(normed), post_mlp.weight, after.weight, after.eps, post_mlp.eps)
    after.expect(out, ahead)
    return out


# each kind's forward and the norms its adds fuse, in order (the input norm is every kind's first)
_FORWARDS = {"pre": (_pre_norm, ("post_attention_layernorm",)),
             "sandwich": (_sandwich, ("post_attention_layernorm", "pre_feedforward_layernorm",
                                      "post_feedforward_layernorm"))}


def _fusable(layer: nn.Module) -> str | None:
    """The layer's kind when every norm it calls is a kernels RMSNorm (use_kernel_modules swapped them)."""
    kind = vlm_adapter.block_kind(layer)
    if kind is None or not all(isinstance(layer.get(n), RMSNorm) for n in ("input_layernorm", *_FORWARDS[kind][1])):
        return None
    return kind


def use_fused_blocks(model: nn.Module, prims: Primitives) -> int:
    """Give `model`'s decoder layers (after use_kernel_modules) the fused forwards, each linked to the norm its
    output goes to next; returns how many. All or none: a layer left as it was would not hand on its norm."""
    layers = vlm_adapter.decoder_layers(model)
    kinds = [_fusable(layer) for layer in layers]
    final = vlm_adapter.final_norm(model)
    if not layers or None in kinds or not isinstance(final, RMSNorm):
        return 0
    afters = [layer["input_layernorm"] for layer in layers[1:]] + [final]
    own: dict[type, type] = {}
    for layer, kind, after in zip(layers, kinds, afters, strict=True):
        cls = type(layer)
        if cls not in own:
            own[cls] = vlm_adapter.with_forward(cls, _FORWARDS[str(kind)][0])
        layer._gmlx_links = _Links(prims, (*(layer[n] for n in _FORWARDS[str(kind)][1]), after))
        vlm_adapter.recast(layer, own[cls])
    return len(layers)
