"""The real engine factory the server and `gmlx run` use: a model entry -> a running engine of its backend."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from gmlx_server.config.settings import DEFAULT_PROMPT_CACHE_BYTES
from gmlx_server.engine.dir_files import is_model_dir
from gmlx_server.engine.disk_cache import DiskCache
from gmlx_server.engine.disk_files import kv_layout, model_identity
from gmlx_server.engine.drafter import Drafter, load_drafter
from gmlx_server.engine.layout import kv_dtype
from gmlx_server.engine.loader import LoadedModel, load_gguf_model
from gmlx_server.engine.mlx_engine import MLXEngine
from gmlx_server.engine.model_dir import load_model_dir
from gmlx_server.engine.types import Engine
from gmlx_server.engine.vision.vision_loader import load_vision_model

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # only the types: the factory never reads configuration itself
    from gmlx_server.config import ModelEntry, RuntimeEnv


def create_engine(entry: ModelEntry, env: RuntimeEnv) -> Engine:
    """Dispatch on the entry's `backend` (the config refuses names that are not in BACKENDS)."""
    build = BACKENDS.get(entry.backend)
    if build is None:
        raise ValueError(f"no engine backend named {entry.backend!r} (known: {', '.join(BACKENDS)})")
    return build(entry, env)


def create_mlx_engine(entry: ModelEntry, env: RuntimeEnv) -> MLXEngine:
    def load() -> LoadedModel:
        if is_model_dir(entry.path):  # config.json + safetensors: mlx-vlm's own loader, text or vision
            return load_model_dir(entry.path, entry.id, entry.max_kv_size, entry.chat_template)
        text = functools.partial(load_gguf_model, model_id=entry.id, layout=entry.weights,
                                 max_kv_size=entry.max_kv_size, chat_template=entry.chat_template,
                                 kv_quant=entry.kv_quant, kv_dtype=entry.kv_dtype,
                                 native_kernels=env.native_kernels)
        if entry.mmproj is not None:  # the projector's tower beside the text model
            return load_vision_model(entry.path, entry.mmproj, text)
        return text(entry.path)

    draft = entry.draft

    def load_draft(target: LoadedModel) -> Drafter:
        assert draft is not None
        return load_drafter(target, draft, native_kernels=env.native_kernels)

    cache_bytes = env.prompt_cache_bytes if env.prompt_cache_bytes is not None else DEFAULT_PROMPT_CACHE_BYTES
    disk = disk_tier(entry, env) if cache_bytes > 0 else None
    return MLXEngine(load, decode_batch=env.decode_batch or 1, prompt_cache_bytes=cache_bytes,
                     drafter_loader=load_draft if draft is not None else None, disk=disk)


def disk_tier(entry: ModelEntry, env: RuntimeEnv) -> DiskCache | None:
    """The model's disk tier when server.prompt_cache_disk_bytes turns it on."""
    if not env.prompt_cache_disk_bytes or env.prompt_cache_dir is None:
        return None
    layout = kv_layout(entry.kv_quant, entry.weights, entry.max_kv_size, entry.mmproj, env.native_kernels,
                       kv_dtype(entry.kv_dtype, env.native_kernels))
    try:
        return DiskCache(env.prompt_cache_dir, env.prompt_cache_disk_bytes, entry.id, model_identity(entry.path),
                         layout)
    except OSError as e:  # an unwritable directory costs the tier, never the model
        log.warning("prompt cache: disk tier off for %s: %s", entry.id, e)
        return None


BACKENDS: dict[str, Callable[[ModelEntry, RuntimeEnv], Engine]] = {"mlx": create_mlx_engine}
