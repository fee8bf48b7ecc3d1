"""Speech-to-text with Whisper in CTranslate2 form (faster-whisper): decode any container PyAV reads, then
transcribe or translate. Runs on the service's worker thread."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gmlx_server.errors import InvalidRequest

RATE = 16_000  # what Whisper hears


@dataclass(frozen=True)
class Transcript:
    text: str
    language: str
    duration: float
    segments: list[dict[str, Any]] = field(default_factory=list)
    words: list[dict[str, Any]] = field(default_factory=list)


class Transcriber:
    def __init__(self, path: Path, compute_type: str) -> None:
        from faster_whisper import WhisperModel

        if not (path / "model.bin").exists():
            raise ValueError(f"{path} is not a CTranslate2 Whisper directory (no model.bin); MLX Whisper "
                             "directories are not served by this build")
        self.model: Any = WhisperModel(str(path), device="cpu", compute_type=compute_type)
        self.multilingual = bool(self.model.model.is_multilingual)

    def decode(self, data: bytes, max_s: float) -> np.ndarray:
        """16 kHz mono float32; a typed 400 for what is not audio or runs longer than max_s."""
        import av
        from faster_whisper.audio import decode_audio

        try:
            probe: Any = av.open(io.BytesIO(data))
            with probe:
                if not probe.streams.audio:
                    raise InvalidRequest("'file' holds no audio stream", param="file")
                known = probe.duration / 1e6 if probe.duration else None
            if known is not None and known > max_s:
                raise too_long(known, max_s)
            audio = decode_audio(io.BytesIO(data), sampling_rate=RATE)
        except av.error.FFmpegError as exc:
            raise InvalidRequest(f"'file' is not audio that can be decoded ({exc})", param="file") from None
        if len(audio) / RATE > max_s:
            raise too_long(len(audio) / RATE, max_s)
        if len(audio) == 0:
            raise InvalidRequest("'file' holds no audio samples", param="file")
        return np.asarray(audio)

    def transcribe(self, audio: np.ndarray, task: str, language: str | None, prompt: str | None,
                   temperature: float | None, words: bool) -> Transcript:
        if not self.multilingual and (task == "translate" or language not in (None, "en")):
            what = "translate" if task == "translate" else f"transcribe language {language!r}"
            raise InvalidRequest(f"this Whisper model is English-only and cannot {what}; configure a multilingual "
                                 "model under services.stt", param="language" if task != "translate" else "model")
        temps: Any = temperature if temperature else [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
        try:
            segs, info = self.model.transcribe(audio, task=task, language=language, initial_prompt=prompt,
                                               temperature=temps, word_timestamps=words)
        except ValueError as exc:  # an unknown language code
            raise InvalidRequest(f"'language': {exc}", param="language") from None
        segments, found = [], []
        for i, s in enumerate(segs):
            segments.append({"id": i, "seek": s.seek, "start": round(s.start, 3), "end": round(s.end, 3),
                             "text": s.text, "tokens": list(s.tokens), "temperature": s.temperature,
                             "avg_logprob": s.avg_logprob, "compression_ratio": s.compression_ratio,
                             "no_speech_prob": s.no_speech_prob})
            found += [{"word": w.word.strip(), "start": round(w.start, 3), "end": round(w.end, 3)}
                      for w in s.words or ()]
        text = "".join(s["text"] for s in segments).strip()
        return Transcript(text, info.language, round(len(audio) / RATE, 3), segments, found)


def too_long(seconds: float, max_s: float) -> InvalidRequest:
    return InvalidRequest(f"'file' is {seconds:.1f} s of audio, longer than the {max_s:g} s allowed "
                          "(services.stt.max_audio_s)", param="file")


def load_transcriber(path: Path, compute_type: str = "int8") -> Transcriber:
    return Transcriber(path, compute_type)
