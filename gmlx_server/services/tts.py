"""Text-to-speech with a Piper voice (ONNX, through piper-tts): sentence by sentence, so speech can stream."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def voice_files(path: Path) -> tuple[Path, Path]:
    """(voice.onnx, voice.onnx.json): the file itself, or the one .onnx voice in a directory."""
    onnx = path
    if path.is_dir():
        found = sorted(path.glob("*.onnx"))
        if not found and (path / "config.json").exists():  # no MLX TTS model could be tested, so none is served
            raise ValueError(f"{path} looks like an MLX (mlx-audio) voice directory; services.tts serves Piper voices "
                             "only (an .onnx file with its .onnx.json)")
        if len(found) != 1:
            raise ValueError(f"{path} holds {len(found)} .onnx files; name the Piper voice file itself")
        onnx = found[0]
    config = onnx.with_name(onnx.name + ".json")
    if onnx.suffix != ".onnx" or not config.exists():
        raise ValueError(f"{onnx} is not a Piper voice (an .onnx file with its .onnx.json beside it)")
    return onnx, config


class Voice:
    def __init__(self, path: Path) -> None:
        from piper import PiperVoice, SynthesisConfig

        onnx, config = voice_files(path)
        self.voice: Any = PiperVoice.load(str(onnx), config_path=str(config))
        self._config = SynthesisConfig
        self.sample_rate = int(self.voice.config.sample_rate)
        self.speakers: dict[str, int] = dict(self.voice.config.speaker_id_map or {})
        self.length_scale = float(self.voice.config.length_scale or 1.0)
        self.name = onnx.stem

    def speaker_id(self, voice: str | None) -> int | None:
        """A multi-speaker voice's speaker by name; None (the voice's default) otherwise."""
        return self.speakers.get(voice) if voice else None

    def synthesize(self, text: str, speed: float, speaker: int | None, emit: Callable[[bytes], None]) -> None:
        """16-bit mono PCM at sample_rate, one chunk per sentence, handed to `emit` as it is made."""
        syn = self._config(speaker_id=speaker, length_scale=self.length_scale / speed)
        for chunk in self.voice.synthesize(text, syn):
            emit(chunk.audio_int16_bytes)


def load_voice(path: Path) -> Voice:
    return Voice(path)
