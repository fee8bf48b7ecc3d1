"""Images -> tower inputs and prompt text, with the family's reference processor (transformers' PIL image
processors: the same resize, tiling and normalisation the published processors run), configured from the
projector's metadata. No MLX: the service runs this in a worker thread.

- Gemma 3: one `image_size` square per image (no pan-and-scan, as llama.cpp); the template's
  `<start_of_image>` becomes "\\n\\n<start_of_image>" + soft tokens + "<end_of_image>\\n\\n".
- Idefics3 (SmolVLM): resized to `preproc_size` on the longest edge, split into `image_size` tiles plus a
  global view; the template's `<image>` becomes the tiles' row/column-tagged runs of `<image>` tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gmlx_server.engine.vision.mmproj import Projector, UnsupportedProjector
from gmlx_server.engine.vision.prompt import ImageSlots, VisionPrompt, pixels_digest, virtual_ids

# family -> (the template's placeholder for an image part, the soft token, the special tokens its prompt uses)
TOKENS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "gemma3": ("<start_of_image>", "<image_soft_token>", ("<start_of_image>", "<end_of_image>")),
    "idefics3": ("<image>", "<image>", ("<fake_token_around_image>", "<global-img>", "<row_1_col_1>")),
}


class ImagePromptError(ValueError):
    """The prompt's image placeholders and the request's images do not agree."""


@dataclass(frozen=True)
class PreparedImage:
    pixels: npt.NDArray[np.float32]  # (frames, C, H, W)
    pixel_mask: npt.NDArray[np.bool_] | None
    text: str  # what the template's placeholder for this image becomes
    tokens: int  # soft tokens in `text`
    digest: bytes


class ImageProcessor:
    def __init__(self, projector: Projector, token_id: Callable[[str], int | None]) -> None:
        self.projector = projector
        self.placeholder, self.image_token, specials = TOKENS[projector.family]
        ids = {t: token_id(t) for t in (self.image_token, *specials)}
        missing = [t for t, i in ids.items() if i is None]
        if missing:
            raise UnsupportedProjector(f"{projector.path}: the text model's vocabulary lacks {', '.join(missing)}, "
                                       f"which a {projector.family} prompt needs")
        self.image_token_id = int(ids[self.image_token] or 0)
        self._images = _image_processor(projector)

    def prepare(self, image: Any) -> PreparedImage:
        """A PIL image -> its tower inputs and the prompt text that stands for it."""
        p = self.projector
        if p.family == "gemma3":
            out = self._images(images=[image], return_tensors="np")
            pixels = np.asarray(out["pixel_values"], dtype=np.float32)
            n = p.tokens_per_tile
            return PreparedImage(pixels, None, f"\n\n<start_of_image>{'<image_soft_token>' * n}<end_of_image>\n\n", n,
                                 pixels_digest(pixels, None))
        from mlx_vlm.models.smolvlm.processing_smolvlm import get_image_prompt_string

        out = self._images(images=[[image]], return_tensors="np", return_row_col_info=True)
        pixels = np.asarray(out["pixel_values"], dtype=np.float32)[0]
        mask = np.asarray(out["pixel_attention_mask"], dtype=bool)[0]
        rows, cols = int(out["rows"][0][0]), int(out["cols"][0][0])
        text = get_image_prompt_string(rows, cols, p.tokens_per_tile, "<fake_token_around_image>", "<image>",
                                       "<global-img>")
        return PreparedImage(pixels, mask, text, pixels.shape[0] * p.tokens_per_tile, pixels_digest(pixels, mask))

    def expand(self, text: str, images: Sequence[PreparedImage]) -> str:
        """The rendered prompt with each image placeholder replaced by its image's text, in order."""
        parts = text.split(self.placeholder)
        if len(parts) - 1 != len(images):
            raise ImagePromptError(f"the rendered prompt holds {len(parts) - 1} image placeholders "
                                   f"({self.placeholder}) for {len(images)} images")
        out = [parts[0]]
        for img, rest in zip(images, parts[1:], strict=True):
            out += [img.text, rest]
        return "".join(out)

    def bind(self, ids: list[int], images: Sequence[PreparedImage]) -> VisionPrompt:
        """Locate each image's soft tokens in the tokenized prompt and give them the image's virtual ids."""
        where = [i for i, t in enumerate(ids) if t == self.image_token_id]
        need = sum(img.tokens for img in images)
        if len(where) != need:
            raise ImagePromptError(f"the prompt holds {len(where)} image tokens ({self.image_token}) where its "
                                   f"{len(images)} images need {need}")
        slots, at = [], 0
        for img in images:
            positions = tuple(where[at: at + img.tokens])
            at += img.tokens
            for pos, vid in zip(positions, virtual_ids(img.digest, img.tokens), strict=True):
                ids[pos] = vid
            slots.append(ImageSlots(img.digest, img.pixels, img.pixel_mask, positions))
        # Gemma 3 attends both ways inside an image (transformers' token_type_ids mask, llama.cpp's non-causal batch)
        return VisionPrompt(tuple(slots), self.image_token_id, bidirectional=self.projector.family == "gemma3")


def _image_processor(p: Projector) -> Any:
    mean, std = list(p.image_mean), list(p.image_std)
    if p.family == "gemma3":
        from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

        return Gemma3ImageProcessorPil(size={"height": p.image_size, "width": p.image_size}, image_mean=mean,
                                       image_std=std, do_pan_and_scan=False)
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    return Idefics3ImageProcessorPil(size={"longest_edge": p.preproc_size},
                                     max_image_size={"longest_edge": p.image_size}, image_mean=mean,
                                     image_std=std, do_image_splitting=True)
