"""A chat request's images on their way to the engine: refused for a text-only model, loaded, preprocessed
by the model family's processor, and placed in the prompt (each image's soft tokens, keyed by its content).

The messages a vision model's template sees hold every content as a parts list ({"type": "text"} and
{"type": "image"}), the form the families' published templates iterate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from gmlx_server.engine.vision.processor import ImageProcessor, ImagePromptError, PreparedImage
from gmlx_server.engine.vision.prompt import VisionPrompt
from gmlx_server.errors import InvalidRequest, UnsupportedFeature
from gmlx_server.generation_params import GenerationParams, ImageRef
from gmlx_server.serving.image_fetch import ImagePolicy, decode, image_bytes


@dataclass(frozen=True)
class PromptImages:
    """The request's images, prepared; expand() and bind() run in the tokenizing worker thread."""

    processor: ImageProcessor
    images: tuple[PreparedImage, ...]
    param: str  # the conversation's field, for a 400 when placeholders and images disagree

    def expand(self, text: str) -> str:
        try:
            return self.processor.expand(text, self.images)
        except ImagePromptError as e:
            raise InvalidRequest(f"'{self.param}': {e}", param=self.param, code="invalid_image_prompt") from None

    def bind(self, ids: list[int]) -> VisionPrompt | None:
        """Put the images' virtual ids into `ids` (in place); None when the request has no image."""
        if not self.images:
            return None
        try:
            return self.processor.bind(ids, self.images)
        except ImagePromptError as e:
            raise InvalidRequest(f"'{self.param}': {e}", param=self.param, code="invalid_image_prompt") from None


def image_refs(messages: Sequence[dict[str, Any]]) -> list[ImageRef]:
    return [part["image"] for m in messages if isinstance(m.get("content"), list)
            for part in m["content"] if isinstance(part, dict) and part.get("type") == "image"
            and isinstance(part.get("image"), ImageRef)]


async def prompt_images(inp: GenerationParams, processor: ImageProcessor | None, model_id: str,
                        policy: ImagePolicy) -> tuple[GenerationParams, PromptImages | None]:
    """The request with its messages as the model's template takes them, and its images prepared; a 400
    naming the first image part when the model takes none."""
    refs = image_refs(inp.messages)
    if processor is None:
        if refs:
            raise UnsupportedFeature(f"'{refs[0].param}': model '{model_id}' takes no images: it is not a vision "
                                     "model (no mmproj configured)", param=refs[0].param)
        return inp, None
    images = tuple([await _prepare(ref, processor, policy) for ref in refs])
    messages = tuple({**m, "content": _parts(m.get("content"))} for m in inp.messages)
    return replace(inp, messages=messages), PromptImages(processor, images, inp.messages_param)


async def _prepare(ref: ImageRef, processor: ImageProcessor, policy: ImagePolicy) -> PreparedImage:
    data, media = await image_bytes(ref, policy)

    def work() -> PreparedImage:
        return processor.prepare(decode(ref, data, media))

    return await asyncio.to_thread(work)


def _parts(content: Any) -> Any:
    if content is None:
        return content
    if not isinstance(content, list):
        return [{"type": "text", "text": str(content)}]
    return [{"type": "image"} if part.get("type") == "image" else part for part in content]
