"""Every place gmlx reads mlx-vlm's model classes, configs and caches by a name it does not type, in one module.

mlx-vlm's families differ in small ways (a text model with or without `.model`, a config named TextConfig or
ModelConfig, a family with or without make_cache): call sites ask these functions by intent instead of
probing (tests/unit/test_adapters.py holds the rule). Importing this module loads neither MLX nor mlx-vlm:
arch.py is read at boot without them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import FunctionType, ModuleType
from typing import Any

ATTENTION = "scaled_dot_product_attention"  # the name each family's language module calls its attention by


def _models(module: str) -> ModuleType:
    return importlib.import_module(f"mlx_vlm.models.{module}")


def text_model_of(model: Any) -> Any:
    """A vision model's `language_model`, or the model itself when it is text only."""
    return getattr(model, "language_model", model)


def family_module_of(text_model: Any) -> str:
    """The family folder under mlx_vlm.models a text model's class lives in ("qwen2", "gemma3")."""
    return type(text_model).__module__.rsplit(".", 1)[0].removeprefix("mlx_vlm.models.")


def language_model_class(module: str) -> Any:
    """The family's text model class, mlx_vlm.models.<module>.language.LanguageModel."""
    return _models(f"{module}.language").LanguageModel


def config_class(module: str) -> Any:
    """The family's text config class: TextConfig where the family has a vision side, ModelConfig otherwise."""
    mod = _models(f"{module}.config")
    return mod.TextConfig if hasattr(mod, "TextConfig") else mod.ModelConfig


def own_caches(model: Any) -> list[Any] | None:
    """The caches the family's make_cache builds; None for a family without one (qwen2/qwen3's text classes)."""
    return list(model.make_cache()) if hasattr(model, "make_cache") else None


def has_head(model: Any) -> bool:
    """The class has an lm_head slot (a file without output.weight then ties it to the embedding)."""
    return hasattr(model, "lm_head")


def body_of(model: Any) -> Any:
    """The decoder stack (`model.model`) that embeds tokens; Idefics3's text model embeds by itself."""
    return getattr(model, "model", model)


def final_norm(model: Any) -> Any | None:
    """The norm before the head (`model.model.norm`), None for a class without one."""
    return getattr(getattr(model, "model", None), "norm", None)


def set_final_norm(model: Any, norm: Any) -> None:
    model.model.norm = norm


def rope_dims(rope: Any, default: int) -> int:
    """The rotated width of an attention's RoPE module; `default` for a family's own RoPE that does not say."""
    return int(rope.dims) if hasattr(rope, "dims") else default


def batch_columns(cache: Any) -> int | None:
    """A batch cache's shared column count (BatchKVCache, BatchQuantizedKVCache keep per-row offsets and one
    `_idx`); None for any other cache. RotatingKVCache's `_idx` is its write position, not a count."""
    from mlx_vlm.models.cache import BatchKVCache, BatchQuantizedKVCache

    return int(cache._idx) if isinstance(cache, BatchKVCache | BatchQuantizedKVCache) else None


def quantized_cache(cache: Any) -> bool:
    """mlx-vlm's own quantized KV caches (mx.quantize'd tuples, not arrays)."""
    from mlx_vlm.models.cache import BatchQuantizedKVCache, QuantizedKVCache

    return isinstance(cache, QuantizedKVCache | BatchQuantizedKVCache)


def trimmable(cache: Any) -> bool:
    """The cache can drop its newest tokens now (mlx-vlm's is_trimmable, where it has trim at all)."""
    is_trimmable = getattr(cache, "is_trimmable", None)
    return is_trimmable is not None and hasattr(cache, "trim") and bool(is_trimmable())


# What a model's modules call, read so that gmlx can build its own modules for them (engine/kernels/fast_ops.py,
# engine/attention.py): nothing here reassigns an mlx-vlm function.

def swiglu() -> Callable[..., Any]:
    """mlx-vlm's own silu(gate) * up, which its SwiGLU MLPs call."""
    fn: Callable[..., Any] = _models("activations").swiglu
    return fn


def norm_offset(module: Any) -> float | None:
    """What a family's own RMSNorm adds to its weight on each call (Gemma 3's 1.0); None for any other module."""
    return 1.0 if type(module) is _models("gemma3.language").RMSNorm else None


def gated_mlp_kind(module: Any) -> int | None:
    """0 for an MLP whose forward is swiglu(gate, up) (llama's, the shared SwiGLUMLP of qwen2/qwen3), 1 for
    gelu_approx(gate) * up (Gemma 3's), None for any other module."""
    kinds = {_models("llama.language").MLP: 0, _models("mlp").SwiGLUMLP: 0, _models("gemma3.language").MLP: 1}
    return kinds.get(type(module))


def rope_args(rope: Any) -> dict[str, Any] | None:
    """mx.fast.rope's arguments as an nn.RoPE, Llama3RoPE or YarnRoPE instance passes them (RopeArgs' fields);
    None for any other module, whose forward then stays its own."""
    import mlx.nn as nn

    rope_utils = _models("rope_utils")
    kind = type(rope)
    if kind is nn.RoPE:
        return {"dims": rope.dims, "traditional": rope.traditional, "base": rope.base, "scale": rope.scale}
    if kind is not rope_utils.Llama3RoPE and kind is not rope_utils.YarnRoPE:
        return None
    args = {"dims": rope.dims, "traditional": rope.traditional, "base": None, "scale": 1.0, "freqs": rope._freqs}
    return args | {"mscale": float(rope.mscale)} if kind is rope_utils.YarnRoPE else args


# The families whose Attention forward is the plain one gmlx's HeadsAttention computes (engine/kernels/heads.py):
# q/k/v projections split into heads, q/k norms where the layer has them, RoPE at the cache's offset, the cache's
# update_and_fetch, the family's attention (Gemma 3 trims a sliding layer's mask to its keys), and o_proj.
PLAIN_ATTENTION = ("llama", "qwen2", "qwen3", "gemma3")


def plain_attention(module: Any) -> bool:
    """The module is gmlx's with_attention subclass of one of PLAIN_ATTENTION's Attention classes (so its
    family_attention is gmlx's routed attention)."""
    own = {_models(f"{f}.language").Attention for f in PLAIN_ATTENTION}
    return type(module).__module__ == __name__ and type(module).__bases__[0] in own


def attention_heads(module: Any) -> tuple[int, int]:
    """A plain_attention module's query and KV head counts."""
    return int(module.n_heads), int(module.n_kv_heads)


def calls_attention(cls: type) -> bool:
    """The class's own forward calls its language module's scaled_dot_product_attention (each family's
    Attention): the functions with_attention can rebuild."""
    forward = vars(cls).get("__call__")
    return (cls.__module__.startswith("mlx_vlm.models.") and isinstance(forward, FunctionType)
            and ATTENTION in forward.__code__.co_names and ATTENTION in forward.__globals__)


def family_attention(cls: type) -> Callable[..., Any]:
    """The attention function a calls_attention class's forward calls (mlx-vlm's, as its module binds it)."""
    fn: Callable[..., Any] = vars(cls)["__call__"].__globals__[ATTENTION]
    return fn


def with_attention(cls: type, attention: Callable[..., Any]) -> type:
    """A subclass of a calls_attention class whose forward is the family's own code calling `attention` instead:
    the same code object over a copy of its module's globals, so mlx-vlm's module is left as it is."""
    own: FunctionType = vars(cls)["__call__"]
    forward = FunctionType(own.__code__, {**own.__globals__, ATTENTION: attention}, own.__name__,
                           own.__defaults__, own.__closure__)
    forward.__kwdefaults__ = own.__kwdefaults__
    return type(f"Gmlx{cls.__name__}", (cls,), {"__call__": forward, "__module__": __name__})


# The families whose decoder layer (TransformerBlock) is pre-norm: x + attn(norm(x)), then h + mlp(norm(h));
# and Gemma 3's sandwich, whose sublayers' outputs are normed before each add and whose MLP has its own
# norm. engine/kernels/blocks.py computes these forwards with each residual add fused with the norm after it.
PRE_NORM_BLOCKS = ("llama", "qwen2", "qwen3")
SANDWICH_BLOCKS = ("gemma3",)


def block_kind(module: Any) -> str | None:
    """"pre" or "sandwich" for one of those families' decoder layers (their own class, not a subclass), else None."""
    cls = type(module)
    for kind, families in (("pre", PRE_NORM_BLOCKS), ("sandwich", SANDWICH_BLOCKS)):
        if any(cls is _models(f"{f}.language").TransformerBlock for f in families):
            return kind
    return None


def decoder_layers(model: Any) -> list[Any]:
    """The text model's decoder layers in order (`model.model.layers`)."""
    return list(body_of(model).layers)


def with_forward(cls: type, forward: Callable[..., Any]) -> type:
    """A subclass of `cls` whose forward is `forward` (called as cls's would be); cls itself is left as it is."""
    return type(f"Gmlx{cls.__name__}", (cls,), {"__call__": forward, "__module__": __name__})


def recast(module: Any, cls: type) -> None:
    """Make one model's module instance an instance of `cls` (a with_attention subclass of its class)."""
    module.__class__ = cls
