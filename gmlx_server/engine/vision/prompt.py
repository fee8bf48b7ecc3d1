"""A request's images as the engine receives them: tower inputs, and where their soft tokens sit in the prompt.

Pure data (numpy, no MLX), so the service builds it and the engine thread consumes it. The prompt carries,
at each soft-token position, a *virtual* id derived from the image's content (at or above VIRTUAL_BASE, far
past any vocabulary): the prompt cache keys on token ids, so a follow-up about the same image matches its
prefix token for token and a different image never does. The engine feeds those positions the image's
features instead of an embedding row.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

VIRTUAL_BASE = 1 << 30  # ids from here up are image slots (int32 holds them; no vocabulary comes near)
_SPAN = (1 << 31) - 1 - VIRTUAL_BASE


@dataclass(frozen=True)
class ImageSlots:
    """One image: its tower inputs (one frame, or a family's tiles) and the prompt positions of its tokens."""

    digest: bytes  # of its pixels: equal inputs, equal features
    pixels: npt.NDArray[np.float32]  # (frames, channels, height, width)
    pixel_mask: npt.NDArray[np.bool_] | None  # (frames, height, width): real pixels, not padding
    positions: tuple[int, ...]  # prompt positions of its soft tokens, in the order of its features

    @property
    def start(self) -> int:
        return self.positions[0]

    @property
    def end(self) -> int:
        return self.positions[-1] + 1


@dataclass(frozen=True)
class VisionPrompt:
    images: tuple[ImageSlots, ...]
    image_token_id: int  # what the model's vocabulary calls a soft token (the sampler's history reads it)
    bidirectional: bool  # Gemma 3: an image's soft tokens attend to each other both ways (one prefill chunk)

    @property
    def token_count(self) -> int:
        return sum(len(i.positions) for i in self.images)


def pixels_digest(pixels: npt.NDArray[np.float32], mask: npt.NDArray[np.bool_] | None) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(str(pixels.shape).encode())
    h.update(np.ascontiguousarray(pixels).tobytes())
    if mask is not None:
        h.update(np.ascontiguousarray(mask).tobytes())
    return h.digest()


def virtual_ids(digest: bytes, count: int) -> list[int]:
    """The ids an image's `count` soft tokens carry in the prompt: distinct per position and per image."""
    out = []
    for i in range(count):
        h = hashlib.blake2b(digest + i.to_bytes(4, "little"), digest_size=8).digest()
        out.append(VIRTUAL_BASE + int.from_bytes(h, "little") % _SPAN)
    return out


def real_ids(tokens: Sequence[int], image_token_id: int) -> list[int]:
    """The prompt as the model's vocabulary spells it: every image slot back to the soft-token id."""
    return [image_token_id if t >= VIRTUAL_BASE else t for t in tokens]
