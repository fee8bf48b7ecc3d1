"""Prepare a process that will run MLX: called by the entry points (`gmlx serve`, the ASGI app, `gmlx run`)
before mlx is first imported, so that importing gmlx (config, `gmlx top`, `gmlx plan`, `gmlx launch`)
never touches BLAS or the environment."""

from __future__ import annotations

import os

from gmlx_server.config import RuntimeEnv, ServerConfig, read_env
from gmlx_server.engine.blas import BlasChoice, prefer_openblas


def preload_blas(env: RuntimeEnv | None = None) -> BlasChoice:
    """OpenBLAS in front of the mlx-cpu wheel's reference BLAS, unless GMLX_BLAS says otherwise."""
    return prefer_openblas((env if env is not None else read_env()).blas)


def prepare_process(config: ServerConfig) -> BlasChoice:
    if config.server.hf_cache:
        os.environ["HF_HUB_OFFLINE"] = "1"  # before any Hugging Face library is imported (they read it then)
    return preload_blas(config.env)
