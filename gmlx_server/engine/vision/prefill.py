"""A request's images in its prefill: the engine's RequestRun calls the bound model instead of the text model.

For each prefill chunk, positions holding image slots get the tower's features (computed once per image,
when the first chunk reaches it; a prompt-cache hit past an image never runs the tower) and the rest their
embedding rows, merged as mlx-vlm merges them. Gemma 3 then attends bidirectionally inside each image, as
transformers and llama.cpp do (mlx-vlm's own Gemma 3 prefill is causal there), which needs each image whole
in one chunk: `chunk_end` moves a chunk's end off an image's interior.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from gmlx_server.engine.types import GenerationRequest
from gmlx_server.engine.vision.prompt import VIRTUAL_BASE, ImageSlots, VisionPrompt, real_ids
from gmlx_server.engine.vlm_adapter import body_of


@dataclass
class VisionRuntime:
    """What a vision model's text model carries beside its weights (a plain object, not an MLX child module)."""

    tower: Any  # tower.VisionTower
    family: str


@dataclass
class ImageBinding:
    """A request's view of the model: `model` for its prefill, its prompt in vocabulary ids, its chunking."""

    model: Any
    token_ids: Sequence[int]
    vision: VisionPrompt | None = None

    def chunk_end(self, pos: int, end: int) -> int:
        """The end of the prefill chunk from `pos`: never inside an image that must be prefilled whole."""
        if self.vision is None or not self.vision.bidirectional:
            return end
        for img in self.vision.images:
            if img.start < end < img.end:
                return img.end if img.start <= pos else img.start
        return end


def bind_images(model: Any, runtime: VisionRuntime | None, req: GenerationRequest) -> ImageBinding:
    """The request's prefill: through `runtime`, the model's vision tower, when its prompt has images."""
    vision = req.vision
    if vision is None:
        return ImageBinding(model, req.prompt_tokens)
    if runtime is None:
        raise ValueError("this model has no vision tower (no mmproj): it cannot take images")
    return ImageBinding(_Prefill(model, runtime, vision), real_ids(req.prompt_tokens, vision.image_token_id), vision)


class _Prefill:
    """Called as the text model is (`(ids[None], cache=...)` -> `.logits`), for one request's prefill."""

    def __init__(self, model: Any, runtime: VisionRuntime, vision: VisionPrompt) -> None:
        self.model, self.runtime, self.vision = model, runtime, vision
        self._features: dict[int, mx.array] = {}  # image index -> (tokens, hidden)

    def __call__(self, ids: mx.array, cache: list[Any]) -> Any:
        start, n = int(cache[0].offset), ids.shape[1]
        slots = self._slots(start, n)
        clean = mx.where(ids >= VIRTUAL_BASE, self.vision.image_token_id, ids)
        if not slots:
            return self.model(clean, cache=cache)
        embeds = body_of(self.model).embed_tokens(clean)
        rel, feats = self._merge(slots, start, n)
        if self.runtime.family == "gemma3":
            # Gemma's text model multiplies every input row by sqrt(hidden) (rounded to bf16): undo it for images.
            scale = mx.array(self.model.config.hidden_size ** 0.5, mx.bfloat16).astype(mx.float32)
            feats = feats / scale
        embeds[0, rel] = feats.astype(embeds.dtype)
        if self.runtime.family == "gemma3":
            return _gemma3_forward(self.model, embeds, cache, self._blocks(start, n))
        return self.model(clean, cache=cache, inputs_embeds=embeds)

    def _slots(self, start: int, n: int) -> list[tuple[int, ImageSlots]]:
        return [(k, img) for k, img in enumerate(self.vision.images) if img.start < start + n and img.end > start]

    def _merge(self, slots: list[tuple[int, ImageSlots]], start: int, n: int) -> tuple[mx.array, mx.array]:
        """(chunk-relative positions, their feature rows) for every image slot inside the chunk."""
        rel: list[int] = []
        rows: list[mx.array] = []
        for k, img in slots:
            feats = self._image(k, img)
            pos = np.asarray(img.positions)
            inside = np.nonzero((pos >= start) & (pos < start + n))[0]
            rel.extend((pos[inside] - start).tolist())
            rows.append(feats[mx.array(inside)])
        return mx.array(rel), mx.concatenate(rows)

    def _image(self, k: int, img: ImageSlots) -> mx.array:
        if k not in self._features:
            mask = mx.array(img.pixel_mask) if img.pixel_mask is not None else None
            out = self.runtime.tower(mx.array(img.pixels), mask)
            self._features[k] = out.reshape(-1, out.shape[-1])
            if self._features[k].shape[0] != len(img.positions):
                raise ValueError(f"image {k}: the tower made {self._features[k].shape[0]} features for "
                                 f"{len(img.positions)} prompt slots")
        return self._features[k]

    def _blocks(self, start: int, n: int) -> mx.array:
        """Per chunk position: the index of the image it belongs to, -1 for text."""
        ids = np.full(n, -1, dtype=np.int32)
        for k, img in enumerate(self.vision.images):
            pos = np.asarray(img.positions) - start
            ids[pos[(pos >= 0) & (pos < n)]] = k
        return mx.array(ids)


def _gemma3_forward(lm: Any, embeds: mx.array, cache: list[Any], blocks: mx.array) -> Any:
    """mlx-vlm's Gemma3Model loop over the layers, with each layer's causal mask opened inside images."""
    from mlx_vlm.models.base import LanguageModelOutput

    inner = lm.model
    n, pattern, window = embeds.shape[1], inner.sliding_window_pattern, inner.window_size
    h = embeds * mx.array(lm.config.hidden_size ** 0.5, mx.bfloat16).astype(embeds.dtype)
    same = (blocks[:, None] == blocks[None, :]) & (blocks[:, None] >= 0)
    rows, cols = mx.arange(n)[:, None], mx.arange(n)[None, :]
    full = _open(cache[pattern - 1].make_mask(n, return_array=True, window_size=None), same)
    local = _open(cache[0].make_mask(n, return_array=True, window_size=window), same & (rows - cols < window))
    for i, (layer, c) in enumerate(zip(inner.layers, cache, strict=True)):
        h = layer(h, full if i % pattern == pattern - 1 else local, c)
    return LanguageModelOutput(logits=lm.lm_head(inner.norm(h)))


def _open(mask: mx.array, pairs: mx.array) -> mx.array:
    """OR the chunk's own (n, n) pairs into the last n key columns (a cache puts the new keys last)."""
    n, k = pairs.shape[0], mask.shape[-1]
    return mx.concatenate([mask[:, : k - n], mask[:, k - n:] | pairs], axis=1)
