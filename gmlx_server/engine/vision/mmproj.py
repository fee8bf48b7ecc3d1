"""llama.cpp's projector GGUF (an `mmproj` file: `clip.*` metadata, `v.*` / `mm.*` tensors), read without MLX.

What gmlx serves is the intersection of what llama.cpp's converter writes and what mlx-vlm implements:
Gemma 3 (SigLIP tower, pooled soft-token projector) and Idefics3 (SmolVLM: SigLIP tower, pixel-shuffle
connector). Any other projector type is refused at load with the reason.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gmlx_plan.gguf_header import GGUFHeader, read_header

# projector type -> (mlx-vlm model module, the text architectures its language models are converted to)
FAMILIES: dict[str, tuple[str, frozenset[str]]] = {
    "gemma3": ("gemma3", frozenset({"gemma3"})),
    "idefics3": ("idefics3", frozenset({"llama"})),
}


class UnsupportedProjector(ValueError):
    """The mmproj file is not a projector gmlx can load, or does not fit the text model."""


@dataclass(frozen=True)
class Projector:
    """A projector's geometry and preprocessing, from its `clip.vision.*` metadata."""

    path: str
    family: str  # a FAMILIES key
    image_size: int  # the tower's input side, in pixels
    patch_size: int
    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int
    eps: float
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    projection_dim: int  # the text model's hidden size the features are projected to
    scale_factor: int  # gemma3: pooling kernel side; idefics3: pixel-shuffle factor
    preproc_size: int  # idefics3: the longest edge an image is resized to before it is split into tiles
    weights_bytes: int

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def tokens_per_tile(self) -> int:
        """Soft tokens one tower input becomes: pooled (gemma3) or pixel-shuffled (idefics3)."""
        return (self.patches_per_side // self.scale_factor) ** 2


def read_projector(path: str | Path) -> Projector:
    """The projector's description; UnsupportedProjector, with the reason, for anything gmlx cannot run."""
    header = read_header(path)
    meta = header.metadata
    if header.architecture != "clip" or not meta.get("clip.has_vision_encoder"):
        raise UnsupportedProjector(f"{path}: not a vision projector (general.architecture "
                                   f"{header.architecture!r}; an mmproj file from llama.cpp's converter has 'clip' "
                                   "and a vision encoder)")
    kind = str(meta.get("clip.projector_type") or meta.get("clip.vision.projector_type") or "")
    if kind not in FAMILIES:
        raise UnsupportedProjector(f"{path}: projector type {kind!r} is not supported (supported: "
                                   f"{', '.join(sorted(FAMILIES))}: the families both llama.cpp and mlx-vlm cover)")
    return _projector(header, kind)


class _Meta:
    """clip.vision.* values, typed; a missing key without a default is the file's fault."""

    def __init__(self, h: GGUFHeader) -> None:
        self.h = h

    def raw(self, key: str, default: Any = None) -> Any:
        value = self.h.metadata.get(f"clip.vision.{key}", default)
        if value is None:
            raise UnsupportedProjector(f"{self.h.path}: clip.vision.{key} is missing")
        return value

    def integer(self, key: str, default: int | None = None) -> int:
        return int(self.raw(key, default))

    def triple(self, key: str) -> tuple[float, float, float]:
        a, b, c = (float(x) for x in self.raw(key, [0.5, 0.5, 0.5]))
        return a, b, c


def _projector(h: GGUFHeader, kind: str) -> Projector:
    m = _Meta(h)
    image_size = m.integer("image_size")
    default_scale = 4 if kind == "gemma3" else 2  # the converter writes gemma3's only when it is not 4
    return Projector(
        path=h.path, family=kind, image_size=image_size, patch_size=m.integer("patch_size"),
        hidden_size=m.integer("embedding_length"), intermediate_size=m.integer("feed_forward_length"),
        layers=m.integer("block_count"), heads=m.integer("attention.head_count"),
        eps=float(m.raw("attention.layer_norm_epsilon", 1e-6)),
        image_mean=m.triple("image_mean"), image_std=m.triple("image_std"),
        projection_dim=m.integer("projection_dim"), scale_factor=m.integer("projector.scale_factor", default_scale),
        preproc_size=m.integer("preproc_image_size", image_size), weights_bytes=sum(t.nbytes for t in h.tensors),
    )


def tower_bytes(path: str | Path, on_gpu: bool | None = None) -> int:
    """What the tower holds once loaded (the load gate's figure): dense fp32 on the CPU, fp16 on Metal."""
    gpu = on_gpu if on_gpu is not None else platform.system() == "Darwin"
    return sum(t.n_elements for t in read_header(path, strings=False).tensors) * (2 if gpu else 4)


def check_pair(projector: Projector, text: GGUFHeader) -> None:
    """The projector must feed this text model: its family's architecture and the text hidden size."""
    _, archs = FAMILIES[projector.family]
    if text.architecture not in archs:
        raise UnsupportedProjector(f"{projector.path}: a {projector.family} projector needs a "
                                   f"{'/'.join(sorted(archs))} text model, and {text.path} is "
                                   f"{text.architecture!r}")
    hidden = int(text.arch_value("embedding_length", 0))
    if hidden != projector.projection_dim:
        raise UnsupportedProjector(f"{projector.path}: projects to {projector.projection_dim} dimensions, and the "
                                   f"text model {text.path} has {hidden}: they are not a pair")
