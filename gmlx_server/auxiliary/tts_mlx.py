"""Text-to-speech with mlx-audio's Kokoro on an MLX directory: config.json (model_type kokoro), its .safetensors
weights and voices/<name>.safetensors. A voice's first letter is its language (af_heart: American English,
ef_dora: Spanish), as Kokoro names them; mlx-audio's pipeline turns text into phonemes for that language and
speaks it segment by segment. Loaded and run on the service's worker thread."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gmlx_server.auxiliary.stt_mlx import read_config
from gmlx_server.errors import InvalidRequest, clip

SERVED = ("kokoro",)
SEED = 0  # Kokoro's excitation adds noise: a fixed seed per request makes the same request speak the same audio


def is_mlx_tts(path: Path) -> bool:
    """A directory with config.json and .safetensors weights (what mlx-audio loads)."""
    return path.is_dir() and (path / "config.json").exists() and any(path.glob("*.safetensors"))


def english_g2p_missing() -> str | None:
    """Why misaki's English G2P cannot run offline here, or None: it needs spaCy's en_core_web_sm, which it
    would otherwise try to download at first use."""
    if importlib.util.find_spec("spacy") is None:
        return "misaki's English G2P needs spaCy (pip install 'misaki[en]')"
    import spacy.util

    if not spacy.util.is_package("en_core_web_sm"):
        return "misaki's English G2P needs spaCy's en_core_web_sm model installed"
    return None


class KokoroVoice:
    backend = "mlx-audio"

    def __init__(self, path: Path) -> None:
        from mlx_audio.tts.models.kokoro.pipeline import LANG_CODES
        from mlx_audio.tts.utils import load_model

        names = sorted(p.stem for p in (path / "voices").glob("*.safetensors"))
        self.voices = {n: n[0] for n in names if n[0] in LANG_CODES}  # name -> Kokoro language code
        if not self.voices:
            raise ValueError(f"{path} holds no Kokoro voices (voices/<name>.safetensors, the name starting with "
                             f"a language code: {', '.join(LANG_CODES)})")
        # a missing weight fails the load, never random; the type is given, as not every Kokoro config names it
        self.model: Any = load_model(path, strict=True, model_type="kokoro")
        self.sample_rate = int(self.model.sample_rate)
        self.name = path.name

    def pick(self, voice: str | None) -> str:
        if voice not in self.voices:
            said = "'voice' is required" if voice is None else f"'voice' {clip(voice)!r} is not a voice of this model"
            raise InvalidRequest(f"{said}; it has: {', '.join(self.voices)}", param="voice")
        if self.voices[voice] in "ab" and (why := english_g2p_missing()):
            raise InvalidRequest(f"'voice' {voice!r} speaks English, and {why}; pick a voice of another language",
                                 param="voice")
        return voice

    def synthesize(self, text: str, speed: float, choice: Any, emit: Callable[[bytes], None]) -> None:
        import mlx.core as mx

        mx.random.seed(SEED)
        try:
            for part in self.model.generate(text, voice=choice, speed=speed, lang_code=self.voices[choice]):
                emit(pcm16(np.asarray(part.audio)))
        except ImportError as exc:  # the language's G2P extra (misaki[ja], misaki[zh]) is missing
            raise InvalidRequest(f"'voice' {choice!r}: {exc}", param="voice") from None


def pcm16(audio: np.ndarray) -> bytes:
    """float samples in [-1, 1] as 16-bit little-endian PCM (clipped, as a sound card would)."""
    return bytes((np.clip(audio.reshape(-1), -1.0, 1.0) * 32767).astype("<i2").tobytes())


def family(config: dict[str, Any]) -> str:
    """The config's model_type; Kokoro by its keys when it names none (hexgrad's config.json does not)."""
    if config.get("model_type"):
        return str(config["model_type"])
    return "kokoro" if {"istftnet", "plbert", "vocab"} <= config.keys() else ""


def load_mlx_voice(path: Path) -> KokoroVoice:
    family_name = family(read_config(path))
    if family_name not in SERVED:
        raise ValueError(f"{path} is an mlx-audio model of type {family_name or '(none)'!r}; services.tts serves "
                         f"Piper voices and mlx-audio's {', '.join(SERVED)}")
    return KokoroVoice(path)
