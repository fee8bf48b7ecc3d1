"""A model directory (MLX or Hugging Face layout: config.json, *.safetensors, tokenizer.json) loaded by
mlx-vlm's own loader, text or vision, into the same LoadedModel a GGUF becomes.

Everything after the load is the GGUF path's: the engine runs the text model (a vision model's
`language_model`), the prompt cache, batching, admission and residency are unchanged. What a directory
lacks is a GGUF header, so the planner has no memory model for it: the capacity table is absent, and the
load gate learns its weights when it first loads.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlx.core as mx

from gmlx_plan.families import family_of
from gmlx_plan.gguf_header import GGUFHeader
from gmlx_server.engine.arch import ArchSpec, make_cache
from gmlx_server.engine.attention import use_gmlx_attention
from gmlx_server.engine.dir_files import text_config
from gmlx_server.engine.dir_tokenizer import DirTokenizer, dir_template, read_json
from gmlx_server.engine.gguf_tensors import LoadReport
from gmlx_server.engine.kv_quant import CacheFactory
from gmlx_server.engine.loader import LoadedModel
from gmlx_server.engine.types import ModelInfo
from gmlx_server.engine.vision.dir_vision import dir_tower_modules, projector_from_dir, vision_family
from gmlx_server.engine.vision.prefill import VisionRuntime
from gmlx_server.engine.vision.processor import ImageProcessor
from gmlx_server.engine.vision.tower import VisionTower
from gmlx_server.engine.vlm_adapter import family_module_of, text_model_of

log = logging.getLogger("gmlx.engine")


def load_model_dir(path: str | Path, model_id: str | None = None, max_kv_size: int | None = None,
                   chat_template: str | None = None) -> LoadedModel:
    from mlx_vlm.utils import load_model  # mlx-vlm's loader: its model classes, sanitizing and quantization

    start, d = time.perf_counter(), Path(path)
    config = read_json(d / "config.json")
    model = load_model(d)
    text = text_model_of(model)
    kind = str(config["model_type"])
    family = family_of(kind).name
    module = family_module_of(text)
    use_gmlx_attention(text, cpu=mx.default_device() != mx.gpu)  # gmlx's CPU attention, as for a GGUF
    tokenizer = DirTokenizer(d)
    info = _info(d, config, model, text, model_id, max_kv_size, family)
    spec = ArchSpec(family, module, lambda h, v: {}, {})  # no GGUF names to map: mlx-vlm loaded the weights
    loaded = LoadedModel(text, _header(d, kind, tokenizer.vocab_size), spec, info,
                         tokenizer,  # type: ignore[arg-type]  # the same interface as the GGUF tokenizer
                         dir_template(d, family, chat_template), LoadReport(total_bytes=info.weights_bytes),
                         CacheFactory(lambda: make_cache(text)))
    vision = vision_family(config)
    if vision is not None:
        projector = projector_from_dir(d, config, vision)
        loaded = replace(loaded, vision=VisionRuntime(VisionTower(projector, dir_tower_modules(model, vision)), vision),
                         info=replace(info, vision=ImageProcessor(projector, tokenizer.token_to_id)))
    loaded.info = replace(loaded.info, load_s=time.perf_counter() - start)
    log.info("loaded %s (%s directory, %s) in %.2f s through mlx-vlm's loader: %d layers, context %d, %.1f MB%s",
             loaded.info.model_id, kind, d, loaded.info.load_s, info.n_layers, info.context_length,
             info.weights_bytes / 1e6, f"; vision: {vision}" if vision else "")
    return loaded


def _header(d: Path, kind: str, vocab: int) -> GGUFHeader:
    """The two facts the engine reads from a header (architecture, logits width), for a directory."""
    return GGUFHeader(str(d), 0, {"general.architecture": kind, f"{kind}.vocab_size": vocab}, (), 0, 0)


def _info(d: Path, config: dict[str, Any], model: Any, text: Any, model_id: str | None, max_kv_size: int | None,
          family: str) -> ModelInfo:
    from mlx.utils import tree_flatten

    tc = text_config(config)
    heads = int(tc.get("num_attention_heads", 1))
    trained = int(tc.get("max_position_embeddings", 4096))
    weights = sum(v.nbytes for _, v in tree_flatten(model.parameters()))  # a vision model's tower included
    return ModelInfo(
        model_id=model_id or d.name, path=str(d), architecture=str(config["model_type"]), family=family,
        context_length=min(trained, max_kv_size) if max_kv_size else trained, trained_context_length=trained,
        n_layers=len(text.layers), n_kv_heads=int(tc.get("num_key_value_heads", heads)),
        head_dim=int(tc.get("head_dim") or int(tc.get("hidden_size", 0)) // heads),
        sliding_window=tc.get("sliding_window"), weights_layout="mlx", weights_bytes=weights, load_s=0.0,
    )
