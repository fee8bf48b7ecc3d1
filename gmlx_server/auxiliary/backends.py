"""Which backend serves a service model, chosen by what its directory holds; each backend's library is imported
only when it loads (an ImportError names the missing extra). Here, apart from the backends, so none of them
imports another to choose."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gmlx_server.auxiliary.service_thread import ServiceBackend
from gmlx_server.config import ServiceEntry

if TYPE_CHECKING:
    from gmlx_server.auxiliary.stt import Transcriber
    from gmlx_server.auxiliary.tts import Speaker


def default_loader(entry: ServiceEntry, path: Path | None) -> ServiceBackend:
    """The kind's backend."""
    if path is None:
        raise ValueError("no model path")
    if entry.kind in ("embeddings", "rerank"):
        from gmlx_server.auxiliary.embeddings import load_embedder

        return load_embedder(path, int(entry.options.get("max_batch", 32)))
    if entry.kind == "stt":
        return load_transcriber(path, str(entry.options["compute_type"]))
    return load_voice(path)


def load_transcriber(path: Path, compute_type: str = "auto") -> Transcriber:
    """The backend by what the directory holds: model.bin is CTranslate2 (faster-whisper); config.json with
    safetensors or npz weights is MLX (mlx-audio's Whisper)."""
    if (path / "model.bin").exists():
        from gmlx_server.auxiliary.stt import Ct2Transcriber

        return Ct2Transcriber(path, "int8" if compute_type == "auto" else compute_type)
    from gmlx_server.auxiliary.stt_mlx import is_mlx_whisper, load_mlx_transcriber

    if is_mlx_whisper(path):
        return load_mlx_transcriber(path, compute_type)
    raise ValueError(f"{path} is not a Whisper directory: neither CTranslate2 (model.bin, for faster-whisper) nor "
                     "MLX (config.json of a Whisper model with .safetensors or .npz weights, for mlx-audio)")


def load_voice(path: Path) -> Speaker:
    """mlx-audio for a directory with config.json and .safetensors weights; a Piper voice otherwise."""
    from gmlx_server.auxiliary.tts import Voice
    from gmlx_server.auxiliary.tts_mlx import is_mlx_tts, load_mlx_voice

    if is_mlx_tts(path):
        return load_mlx_voice(path)
    return Voice(path)
