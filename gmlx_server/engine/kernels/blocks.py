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
    """A fused layer's route to the extension and the norm its output goes to next (a plain object, so the
    module tree does not take that norm for a child)."""

    prims: Primitives
    after: RMSNorm


def _family_forward(layer: nn.Module, x: mx.array, mask: Any, cache: Any) -> mx.array:
    out: mx.array = type(layer).__bases__[0].__call__(layer, x, mask, cache)
    return out


def _pre_norm(self: Any, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
    links: _Links = self._gmlx_links
    if links.prims.covering(x) is None:
        return _family_forward(self, x, mask, cache)
    r = self.self_attn(self.input_layernorm(x), mask, cache)
    h, normed = links.prims.add_norm(x, r, None, self.post_attention_layernorm)
    out, ahead = links.prims.add_norm(h, self.mlp(normed), None, links.after)
    links.after.expect(out, ahead)
    return out


def _sandwich(self: Any, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
    """Gemma 3's layer in float32, where its clip_residual is a plain add."""
    links: _Links = self._gmlx_links
    if links.prims.covering(x) is None:
        return _family_forward(self, x, mask, cache)
    r = self.self_attn(self.input_layernorm(x), mask, cache)
    h, normed = links.prims.add_norm(x, r, self.post_attention_layernorm, self.pre_feedforward_layernorm)
    out, ahead = links.prims.add_norm(h, self.mlp(normed), self.post_feedforward_layernorm, links.after)
    links.after.expect(out, ahead)
    return out


_FORWARDS = {"pre": (_pre_norm, ("input_layernorm", "post_attention_layernorm")),
             "sandwich": (_sandwich, ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                                      "post_feedforward_layernorm"))}


def _fusable(layer: nn.Module) -> str | None:
    """The layer's kind when every norm it calls is a kernels RMSNorm (use_kernel_modules swapped them)."""
    kind = vlm_adapter.block_kind(layer)
    if kind is None or not all(isinstance(layer.get(n), RMSNorm) for n in _FORWARDS[kind][1]):
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
        layer._gmlx_links = _Links(prims, after)
        vlm_adapter.recast(layer, own[cls])
    return len(layers)
