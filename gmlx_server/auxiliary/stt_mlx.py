"""Speech-to-text with mlx-audio's Whisper on an MLX directory (config.json plus .safetensors or .npz weights;
mlx-audio also reads a transformers Whisper directory). Loaded and run on the service's worker thread."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from gmlx_server.auxiliary.stt import Transcriber, Transcript, temperatures, transcript
from gmlx_server.errors import InvalidRequest

# compute_type on MLX: (activation dtype, 8-bit weights?); "auto" is float16 on a GPU, float32 on the CPU.
COMPUTE_TYPES = {"auto": (None, False), "float32": ("float32", False), "float16": ("float16", False),
                 "int8": (None, True), "int8_float32": ("float32", True), "int8_float16": ("float16", True)}


def read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def is_mlx_whisper(path: Path) -> bool:
    """config.json of a Whisper model with safetensors or npz weights beside it."""
    config = read_config(path)
    whisper = config.get("model_type") == "whisper" or "n_audio_ctx" in config
    return whisper and (any(path.glob("*.safetensors")) or any(path.glob("*.npz")))


def dtype_for(compute_type: str, gpu: bool) -> tuple[str, bool]:
    if compute_type not in COMPUTE_TYPES:
        raise ValueError(f"services.stt.compute_type {compute_type!r} is not one the MLX Whisper backend takes: "
                         f"{', '.join(COMPUTE_TYPES)}")
    dtype, quantize = COMPUTE_TYPES[compute_type]
    return dtype or ("float16" if gpu else "float32"), quantize


class MlxTranscriber(Transcriber):
    backend = "mlx-audio"

    def __init__(self, path: Path, compute_type: str) -> None:
        import mlx.core as mx
        import mlx.nn as nn
        from mlx_audio.stt.models.whisper import whisper
        from mlx_audio.stt.models.whisper.tokenizer import LANGUAGES
        from mlx_audio.utils import apply_quantization, load_weights

        from gmlx_server.engine.mlx_adapter import dtype_named

        config = read_config(path)
        dtype, quantize = dtype_for(compute_type, mx.default_device() == mx.gpu)
        if quantize and (config.get("quantization") or config.get("quantization_config")):
            raise ValueError(f"services.stt.compute_type {compute_type!r} asks to quantize {path}, which is "
                             "quantized already; use auto, float32 or float16")
        model: Any = whisper.Model(whisper.ModelDimensions.from_dict(config), dtype_named(dtype))
        weights = model.sanitize(load_weights(path))
        apply_quantization(model, config, weights)
        model.load_weights(list(weights.items()), strict=True)  # a missing weight fails the load, never random
        if quantize:
            nn.quantize(model, group_size=64, bits=8,
                        class_predicate=lambda _, m: isinstance(m, nn.Linear | nn.Embedding))
        mx.eval(model.parameters())
        model.eval()
        self.model = whisper.Model.post_load_hook(model, path)
        if self.model._processor is None:
            raise ValueError(f"{path} has no Whisper tokenizer that transformers can load (tokenizer.json or "
                             "vocab.json with merges.txt, and preprocessor_config.json)")
        self.fp16 = dtype == "float16"
        self.multilingual = bool(model.is_multilingual)
        self.languages = set(LANGUAGES)

    def transcribe(self, audio: np.ndarray, task: str, language: str | None, prompt: str | None,
                   temperature: float | None, words: bool) -> Transcript:
        self.check_task(task, language)
        if language is not None and language not in self.languages:
            raise InvalidRequest(f"'language': {language!r} is not a Whisper language code (en, fr, de, ...)",
                                 param="language")
        out = self.model.generate(audio, task=task, language=language, initial_prompt=prompt,
                                  temperature=temperatures(temperature), word_timestamps=words, fp16=self.fp16)
        return transcript(out.segments, str(out.language), audio)


def load_mlx_transcriber(path: Path, compute_type: str) -> MlxTranscriber:
    return MlxTranscriber(path, compute_type)
