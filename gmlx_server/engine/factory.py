"""The real engine factory the server and `gmlx run` use: a GGUF entry -> a running MLXEngine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gmlx_server.engine.loader import LoadedModel, load_gguf_model
from gmlx_server.engine.mlx_engine import MLXEngine

if TYPE_CHECKING:  # config is a sibling layer; only its types are needed here
    from gmlx_server.config import ModelEntry, RuntimeEnv


def create_engine(entry: ModelEntry, env: RuntimeEnv) -> MLXEngine:
    def load() -> LoadedModel:
        return load_gguf_model(entry.path, model_id=entry.id, layout=entry.weights,
                               max_kv_size=entry.max_kv_size, chat_template=entry.chat_template)

    cache_bytes = env.prompt_cache_bytes if env.prompt_cache_bytes is not None else 512 << 20
    return MLXEngine(load, decode_batch=env.decode_batch or 1, prompt_cache_bytes=cache_bytes)
