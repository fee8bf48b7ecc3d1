"""Speech-to-text with Whisper: decode any container PyAV reads, then transcribe or translate with the backend
the model directory calls for (faster-whisper for CTranslate2, mlx-audio for MLX). Runs on the service's worker
thread."""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
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
    """A Whisper backend: decoding, the English-only rule and the transcript's shape are shared; each backend
    (CTranslate2 here, MLX in stt_mlx) runs the model."""

    backend = "whisper"
    multilingual = False

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

    def check_task(self, task: str, language: str | None) -> None:
        if not self.multilingual and (task == "translate" or language not in (None, "en")):
            what = "translate" if task == "translate" else f"transcribe language {language!r}"
            raise InvalidRequest(f"this Whisper model is English-only and cannot {what}; configure a multilingual "
                                 "model under services.stt", param="language" if task != "translate" else "model")

    def transcribe(self, audio: np.ndarray, task: str, language: str | None, prompt: str | None,
                   temperature: float | None, words: bool) -> Transcript:
        raise NotImplementedError


def temperatures(temperature: float | None) -> Any:
    """The request's temperature; none (or 0) is Whisper's fallback schedule, hotter after a failed decode."""
    return temperature if temperature else (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def transcript(rows: Iterable[Mapping[str, Any]], language: str, audio: np.ndarray) -> Transcript:
    """OpenAI's verbose_json segments and words from a backend's segment records (dicts of Whisper's fields)."""
    segments: list[dict[str, Any]] = []
    found: list[dict[str, Any]] = []
    for i, s in enumerate(rows):
        segments.append({"id": i, "seek": int(s["seek"]), "start": round(float(s["start"]), 3),
                         "end": round(float(s["end"]), 3), "text": s["text"], "tokens": [int(t) for t in s["tokens"]],
                         "temperature": float(s["temperature"] or 0.0), "avg_logprob": float(s["avg_logprob"]),
                         "compression_ratio": float(s["compression_ratio"]),
                         "no_speech_prob": float(s["no_speech_prob"])})
        found += [{"word": w["word"].strip(), "start": round(float(w["start"]), 3), "end": round(float(w["end"]), 3)}
                  for w in s.get("words") or ()]
    text = "".join(s["text"] for s in segments).strip()
    return Transcript(text, language, round(len(audio) / RATE, 3), segments, found)


class Ct2Transcriber(Transcriber):
    """faster-whisper on a CTranslate2 directory (model.bin)."""

    backend = "faster-whisper"

    def __init__(self, path: Path, compute_type: str) -> None:
        from faster_whisper import WhisperModel

        self.model: Any = WhisperModel(str(path), device="cpu", compute_type=compute_type)
        self.multilingual = bool(self.model.model.is_multilingual)

    def transcribe(self, audio: np.ndarray, task: str, language: str | None, prompt: str | None,
                   temperature: float | None, words: bool) -> Transcript:
        self.check_task(task, language)
        try:
            segs, info = self.model.transcribe(audio, task=task, language=language, initial_prompt=prompt,
                                               temperature=temperatures(temperature), word_timestamps=words)
            rows = [asdict(s) for s in segs]  # the generator decodes as it is read
        except ValueError as exc:  # an unknown language code
            raise InvalidRequest(f"'language': {exc}", param="language") from None
        return transcript(rows, info.language, audio)


def too_long(seconds: float, max_s: float) -> InvalidRequest:
    return InvalidRequest(f"'file' is {seconds:.1f} s of audio, longer than the {max_s:g} s allowed "
                          "(services.stt.max_audio_s)", param="file")
