"""Text-to-speech backends, chosen by what the model path holds: a Piper voice (ONNX, through piper-tts) or an
mlx-audio Kokoro directory (tts_mlx). Both speak 16-bit mono PCM in pieces, so speech can stream."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from gmlx_server.errors import InvalidRequest, clip


class Speaker(Protocol):
    """What the speech job needs of a backend."""

    backend: str
    sample_rate: int

    def pick(self, voice: str | None) -> Any:
        """The request's voice as the backend names it; a typed 400 (param voice) for one it does not have."""

    def synthesize(self, text: str, speed: float, choice: Any, emit: Callable[[bytes], None]) -> None:
        """16-bit mono PCM at sample_rate, handed to `emit` piece by piece as it is made."""


def voice_files(path: Path) -> tuple[Path, Path]:
    """(voice.onnx, voice.onnx.json): the file itself, or the one .onnx voice in a directory."""
    onnx = path
    if path.is_dir():
        found = sorted(path.glob("*.onnx"))
        if len(found) != 1:
            raise ValueError(f"{path} holds {len(found)} .onnx files and is not an mlx-audio directory (config.json "
                             "with .safetensors weights); name the Piper voice file itself")
        onnx = found[0]
    config = onnx.with_name(onnx.name + ".json")
    if onnx.suffix != ".onnx" or not config.exists():
        raise ValueError(f"{onnx} is not a Piper voice (an .onnx file with its .onnx.json beside it)")
    return onnx, config


class Voice:
    """A Piper voice: sentence by sentence."""

    backend = "piper"

    def __init__(self, path: Path) -> None:
        from piper import PiperVoice, SynthesisConfig

        onnx, config = voice_files(path)
        self.voice: Any = PiperVoice.load(str(onnx), config_path=str(config))
        self._config = SynthesisConfig
        self.sample_rate = int(self.voice.config.sample_rate)
        self.speakers: dict[str, int] = dict(self.voice.config.speaker_id_map or {})
        self.length_scale = float(self.voice.config.length_scale or 1.0)
        self.name = onnx.stem

    def pick(self, voice: str | None) -> int | None:
        """A multi-speaker voice's speaker id by name; None (the voice's own) on a single-speaker voice, which
        takes any name (OpenAI's alloy, ...)."""
        if not voice or not self.speakers:
            return None
        if voice not in self.speakers:
            raise InvalidRequest(f"'voice' {clip(voice)!r} is not a speaker of this voice; it has: "
                                 f"{', '.join(self.speakers)}", param="voice")
        return self.speakers[voice]

    def synthesize(self, text: str, speed: float, choice: Any, emit: Callable[[bytes], None]) -> None:
        syn = self._config(speaker_id=choice, length_scale=self.length_scale / speed)
        for chunk in self.voice.synthesize(text, syn):
            emit(chunk.audio_int16_bytes)
