"""A model directory's facts from its files alone (no MLX): what the server checks before a load, lists in
/v1/models and estimates with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gmlx_server.engine.dir_tokenizer import read_json


def is_model_dir(path: str) -> bool:
    return Path(path).is_dir()


def dir_problem(path: str) -> str | None:
    """What keeps mlx-vlm's loader from reading the directory ("PATH: reason"), from its files alone."""
    d = Path(path)
    config = read_json(d / "config.json")
    if not config:
        return f"{path}: a model directory needs config.json"
    if not any(d.glob("*.safetensors")):
        return f"{path}: a model directory needs its weights as *.safetensors"
    if not (d / "tokenizer.json").is_file():
        return f"{path}: a model directory needs tokenizer.json"
    if "model_type" not in config:
        return f"{path}: config.json names no model_type"
    return None


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    tc = config.get("text_config")
    return {**config, **tc} if isinstance(tc, dict) else config


def trained_context(path: str) -> int | None:
    value = text_config(read_json(Path(path) / "config.json")).get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None
