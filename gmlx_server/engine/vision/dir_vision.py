"""A model directory's own vision tower (mlx-vlm loaded it with the model): the same runtime and image
processor as a projector GGUF, described from config.json and the processor config instead of `clip.*`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gmlx_server.engine.dir_tokenizer import read_json
from gmlx_server.engine.vision.mmproj import FAMILIES, Projector

# mlx-vlm model types -> the projector family whose prefill and processor they share
DIR_FAMILIES = {"gemma3": "gemma3", "idefics3": "idefics3", "smolvlm": "idefics3"}


def vision_family(config: dict[str, Any]) -> str | None:
    """The family of a directory's config.json when it has a vision tower gmlx runs, else None."""
    family = DIR_FAMILIES.get(str(config.get("model_type", "")))
    return family if family in FAMILIES and config.get("vision_config") else None


def projector_from_dir(directory: str | Path, config: dict[str, Any], family: str) -> Projector:
    d = Path(directory)
    v, text = config["vision_config"], config.get("text_config") or {}
    images = read_json(d / "preprocessor_config.json") or read_json(d / "processor_config.json").get(
        "image_processor", {})
    size, patch = int(v.get("image_size", 224)), int(v["patch_size"])
    if family == "gemma3":  # pooled to mm_tokens_per_image soft tokens
        scale = (size // patch) // round(int(config.get("mm_tokens_per_image", 256)) ** 0.5)
        preproc = size
    else:
        scale = int(config.get("scale_factor", 2))
        preproc = int((images.get("size") or {}).get("longest_edge", size))
    mean, std = images.get("image_mean", [0.5] * 3), images.get("image_std", [0.5] * 3)
    return Projector(
        path=str(d), family=family, image_size=size, patch_size=patch, hidden_size=int(v["hidden_size"]),
        intermediate_size=int(v.get("intermediate_size", 4 * int(v["hidden_size"]))),
        layers=int(v.get("num_hidden_layers", 0)), heads=int(v.get("num_attention_heads", 0)),
        eps=float(v.get("layer_norm_eps", 1e-6)), image_mean=(mean[0], mean[1], mean[2]),
        image_std=(std[0], std[1], std[2]), projection_dim=int(text.get("hidden_size", 0)), scale_factor=scale,
        preproc_size=preproc, weights_bytes=0,
    )


def dir_tower_modules(model: Any, family: str) -> tuple[Any, Any]:
    """(vision tower, projector) of a loaded mlx-vlm model."""
    if family == "gemma3":
        return model.vision_tower, model.multi_modal_projector
    return model.vision_model, model.connector
