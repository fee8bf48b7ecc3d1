"""Environment variables -> RuntimeEnv: the only place the server reads os.environ."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gmlx_server.config.settings import BLAS_OFF, ConfigError, LogFormat, RuntimeEnv
from gmlx_server.web_policy import host_list, origin_list, split_list

_ListCheck = Callable[[list[str]], tuple[str, ...]]  # normalizes a list or raises ValueError
_FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def _env_value(environ: Mapping[str, str], name: str, kind: type, lo: float | None = None) -> Any:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    raw = raw.strip()
    if kind is bool:
        if raw.lower() not in _FLAGS:
            raise ConfigError("environment", name, f"expected 0 or 1, got {raw!r}")
        return _FLAGS[raw.lower()]
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError("environment", name, f"expected {kind.__name__}, got {raw!r}") from None
    if lo is not None and value < lo:
        raise ConfigError("environment", name, f"must be >= {lo}, got {raw!r}")
    return value


def read_env(environ: Mapping[str, str] | None = None) -> RuntimeEnv:
    """Read every variable the server honors, once; bad values raise ConfigError."""
    e = os.environ if environ is None else environ
    d = RuntimeEnv()
    top_k = _env_value(e, "TOP_LOGPROBS_K", int, 0)
    if top_k is not None and top_k > 20:
        raise ConfigError("environment", "TOP_LOGPROBS_K", f"must be 0 to 20, got {top_k}")

    def pick(value: Any, default: Any) -> Any:
        return default if value is None else value

    return RuntimeEnv(
        config_path=e.get("GMLX_CONFIG") or None,
        model_path=e.get("GMLX_MODEL") or None,
        api_key=e.get("GMLX_API_KEY") or None,
        host=e.get("GMLX_HOST") or None,
        port=_env_value(e, "GMLX_PORT", int, 0),
        sse_keepalive_s=pick(_env_value(e, "GMLX_SSE_KEEPALIVE_S", float, 0.001), d.sse_keepalive_s),
        max_body_bytes=pick(_env_value(e, "GMLX_MAX_BODY_BYTES", int, 1), d.max_body_bytes),
        queue_depth_cap=_env_value(e, "GMLX_QUEUE_DEPTH_CAP", int, 0),
        decode_batch=_env_value(e, "GMLX_DECODE_BATCH", int, 1),
        overcommit=pick(_env_value(e, "GMLX_OVERCOMMIT", bool), d.overcommit),
        preflight_mem=pick(_env_value(e, "GMLX_PREFLIGHT_MEM", bool), d.preflight_mem),
        governor=pick(_env_value(e, "GMLX_GOVERNOR", bool), d.governor),
        clamp_max_tokens=_env_value(e, "GMLX_CLAMP_MAX_TOKENS", bool),
        top_logprobs_k=pick(top_k, d.top_logprobs_k),
        allowed_origins=_env_list(e, "GMLX_ALLOWED_ORIGINS", origin_list),
        allowed_hosts=_env_list(e, "GMLX_ALLOWED_HOSTS", host_list),
        body_timeout_s=pick(_env_value(e, "GMLX_BODY_TIMEOUT_S", float, 0.001), d.body_timeout_s),
        header_timeout_s=pick(_env_value(e, "GMLX_HEADER_TIMEOUT_S", float, 0.001), d.header_timeout_s),
        hf_hub_cache=_hf_hub_cache(e),
        blas=_blas(e),
        native_kernels=pick(_env_value(e, "GMLX_NATIVE_KERNELS", bool), d.native_kernels),
        log_format=_log_format(e),
    )


def _log_format(e: Mapping[str, str]) -> LogFormat:
    raw = (e.get("GMLX_LOG_FORMAT") or "text").strip().lower()
    if raw not in ("text", "json"):
        raise ConfigError("environment", "GMLX_LOG_FORMAT", f"expected text or json, got {raw!r}")
    return "json" if raw == "json" else "text"


def _env_list(e: Mapping[str, str], name: str, check: _ListCheck) -> tuple[str, ...] | None:
    raw = e.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        return check(split_list(raw))
    except ValueError as err:
        raise ConfigError("environment", name, str(err)) from None


def _blas(e: Mapping[str, str]) -> str | None:
    """GMLX_BLAS: off (the mlx-cpu wheel's reference BLAS) or the path of a BLAS library to preload."""
    raw = (e.get("GMLX_BLAS") or "").strip()
    if not raw:
        return None
    if raw.lower() in BLAS_OFF:
        return "off"
    if not Path(raw).expanduser().is_file():
        raise ConfigError("environment", "GMLX_BLAS", f"expected off or the path of a BLAS library, got {raw!r}")
    return str(Path(raw).expanduser())


def _hf_hub_cache(e: Mapping[str, str]) -> str | None:
    """huggingface_hub's own lookup order for the hub cache; None when no variable names one."""
    if e.get("HF_HUB_CACHE") or e.get("HUGGINGFACE_HUB_CACHE"):
        return e.get("HF_HUB_CACHE") or e.get("HUGGINGFACE_HUB_CACHE")
    if e.get("HF_HOME"):
        return str(Path(e["HF_HOME"]) / "hub")
    return str(Path(e["XDG_CACHE_HOME"]) / "huggingface" / "hub") if e.get("XDG_CACHE_HOME") else None


def hf_hub_cache_dir(env: RuntimeEnv) -> Path:
    return Path(env.hf_hub_cache or Path.home() / ".cache" / "huggingface" / "hub").expanduser()


def variable(name: str) -> str | None:
    """One variable the config file names (server.api_keys[].key_env), read when the file is loaded."""
    return os.environ.get(name)
