"""A vision model: the text GGUF as gmlx loads any model, plus the projector GGUF's tower beside it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import mlx.core as mx

from gmlx_plan.gguf_header import read_header
from gmlx_server.engine.kernels.fast_ops import use_kernel_modules
from gmlx_server.engine.loader import LoadedModel, load_gguf_model
from gmlx_server.engine.vision.mmproj import check_pair, read_projector
from gmlx_server.engine.vision.prefill import VisionRuntime
from gmlx_server.engine.vision.processor import ImageProcessor
from gmlx_server.engine.vision.tower import load_tower

log = logging.getLogger("gmlx.engine")


def load_vision_model(path: str | Path, mmproj: str | Path,
                      load_text: Callable[[str | Path], LoadedModel] = load_gguf_model) -> LoadedModel:
    """The text model (`load_text`, load_gguf_model with the entry's options) with the projector's tower
    attached; a projector it cannot run, or that does not fit this text model, is refused before the text
    weights load."""
    start = time.perf_counter()
    projector = read_projector(mmproj)
    check_pair(projector, read_header(path))
    loaded = load_text(path)
    processor = ImageProcessor(projector, loaded.tokenizer.token_to_id)
    dtype = mx.float16 if mx.default_device() == mx.gpu else mx.float32
    tower, report = load_tower(projector, dtype)
    if loaded.kernels is not None:  # the tower's norms on the text model's CPU primitives too
        use_kernel_modules(tower, loaded.kernels)
    info = loaded.info
    loaded = replace(loaded, vision=VisionRuntime(tower, projector.family), info=replace(
        info, vision=processor, weights_bytes=info.weights_bytes + report.total_bytes,
        load_s=time.perf_counter() - start))
    log.info("  vision: %s projector %s, %d-pixel tiles of %d soft tokens, tower %.1f MB (%s)", projector.family,
             projector.path, projector.image_size, projector.tokens_per_tile, report.total_bytes / 1e6,
             "fp16" if dtype == mx.float16 else "fp32")
    return loaded
