"""Every place gmlx reads mlx-vlm's model classes, configs and caches by a name it does not type, in one module.

mlx-vlm's families differ in small ways (a text model with or without `.model`, a config named TextConfig or
ModelConfig, a family with or without make_cache): call sites ask these functions by intent instead of
probing (tests/unit/test_adapters.py holds the rule). Importing this module loads neither MLX nor mlx-vlm:
arch.py is read at boot without them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
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


# Process-wide reassignments of mlx-vlm functions (issue 29 item 3 replaces them by modules that call the
# kernels themselves); kept here so that every one of them is in sight.

def models_function(module: str, name: str) -> Callable[..., Any] | None:
    """mlx_vlm.models.<module>.<name> as it is bound now (None when the module has no such name)."""
    fn: Callable[..., Any] | None = getattr(_models(module), name, None)
    return fn


def set_models_function(module: str, name: str, fn: Callable[..., Any]) -> None:
    setattr(_models(module), name, fn)


def attention_function(family: str) -> Callable[..., Any] | None:
    """The family's language module's attention function; None for a family that calls mx.fast's directly."""
    return models_function(f"{family}.language", ATTENTION)


def set_attention_function(family: str, fn: Callable[..., Any]) -> None:
    set_models_function(f"{family}.language", ATTENTION, fn)
