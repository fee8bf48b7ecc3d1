"""Decoder layers whose residual adds run fused with the norm that follows each (the extension's GKAddNorm).

A pre-norm layer (Llama, Qwen 2/3) adds its attention's output to the residual and norms the sum for the MLP,
then adds the MLP's output and the next layer norms that sum: four ops of little work, each a dispatch on MLX's
CPU backend. Here each add and its norm are one op (the sublayer's last projection's matmul where the attention
or MLP leaves its output unprojected, `Projected`; else GKAddNorm), and the second norm (the next layer's input
norm, or the final norm after the last layer) is handed to that norm module with the array it is of
(RMSNorm.expect), so the next layer's call returns it instead of dispatching again. Gemma 3's sandwich layer
also norms each sublayer's output before its add: one op again. The results are the separate ops' to the bit (rows.h's
norm_row). A call the kernels do not cover (not float32, not on the CPU device) runs the family's forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from gmlx_server.engine import vlm_adapter
from gmlx_server.engine.kernels.fast_ops import GatedMLP, Primitives, RMSNorm
from gmlx_server.engine.kernels.heads import HeadsAttention
from gmlx_server.engine.kernels.modules import Projected

Body = Callable[[Any, ModuleType, mx.array, Any, Any, tuple[RMSNorm, ...]], tuple[mx.array, mx.array]]


@dataclass(frozen=True)
class _Links:
    """What a fused layer's forward reads beside its children, fixed at load: its kind's body, the norms its adds
    fuse, in the order the body applies them, and the norm its output goes to next (the last of them). A plain
    object, so the module tree does not take these norms for children."""

    prims: Primitives
    body: Body
    norms: tuple[RMSNorm, ...]


def _fused(self: Any, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
    """Every fused layer's forward: its kind's body where the kernels cover x, else the family's own forward."""
    links: _Links = self._gmlx_links
    ext = links.prims.covering(x)
    if ext is None:
        family: mx.array = type(self).__bases__[0].__call__(self, x, mask, cache)
        return family
    out, ahead = links.body(self, ext, x, mask, cache, links.norms)
    links.norms[-1].expect(out, ahead)
    return out


def _sublayer(module: Any, *args: Any) -> Projected | mx.array:
    """The attention's or MLP's output, left before its last projection where the module can (Projected)."""
    if isinstance(module, HeadsAttention | GatedMLP):
        return module.projected(*args)
    out: mx.array = module(*args)
    return out


def _joined(ext: ModuleType, x: mx.array, r: Projected | mx.array, norm: RMSNorm,
            r_norm: RMSNorm | None = None) -> tuple[mx.array, mx.array]:
    """(x + r, norm(x + r)), r normed by r_norm first when given: in r's last projection's matmul where r is
    still to be projected (a graph node fewer), else GKAddNorm."""
    r_weight, r_eps = (r_norm["weight"], r_norm.eps) if r_norm is not None else (None, 0.0)
    if isinstance(r, Projected):
        return r.add_norm(x, norm["weight"], norm.eps, r_weight, r_eps)
    h, normed = ext.add_norm(x, r, r_weight, norm["weight"], norm.eps, r_eps)
    return h, normed


def _pre_norm(layer: Any, ext: ModuleType, x: mx.array, mask: Any, cache: Any,
              norms: tuple[RMSNorm, ...]) -> tuple[mx.array, mx.array]:
    post, after = norms
    # children by item: nn.Module's attribute lookup is Python (~1.5 us, 20x a dict item), paid per layer per step
    h, normed = _joined(ext, x, _sublayer(layer["self_attn"], layer["input_layernorm"](x), mask, cache), post)
    return _joined(ext, h, _sublayer(layer["mlp"], normed), after)


def _sandwich(layer: Any, ext: ModuleType, x: mx.array, mask: Any, cache: Any,
              norms: tuple[RMSNorm, ...]) -> tuple[mx.array, mx.array]:
    """Gemma 3's layer in float32, where its clip_residual is a plain add."""
    post_attn, pre_mlp, post_mlp, after = norms
    r = _sublayer(layer["self_attn"], layer["input_layernorm"](x), mask, cache)
    h, normed = _joined(ext, x, r, pre_mlp, post_attn)
    return _joined(ext, h, _sublayer(layer["mlp"], normed), after, post_mlp)


# each kind's body and the norms its adds fuse, in order (the input norm is every kind's first)
_BODIES: dict[str, tuple[Body, tuple[str, ...]]] = {
    "pre": (_pre_norm, ("post_attention_layernorm",)),
    "sandwich": (_sandwich, ("post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"))}


def _fusable(layer: nn.Module) -> str | None:
    """The layer's kind when every norm it calls is a kernels RMSNorm (use_kernel_modules swapped them)."""
    kind = vlm_adapter.block_kind(layer)
    if kind is None or not all(isinstance(layer.get(n), RMSNorm) for n in ("input_layernorm", *_BODIES[kind][1])):
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
            own[cls] = vlm_adapter.with_forward(cls, _fused)
        body, names = _BODIES[str(kind)]
        layer._gmlx_links = _Links(prims, body, (*(layer[n] for n in names), after))
        vlm_adapter.recast(layer, own[cls])
    return len(layers)
