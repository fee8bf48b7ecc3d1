"""The audio routes in OpenAI's shape: the multipart transcription form, its five response formats, and the
speech request."""

from __future__ import annotations

import email.parser
import email.policy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gmlx_server.auxiliary.audio_out import FORMATS as SPEECH_FORMATS
from gmlx_server.auxiliary.embeddings_wire import body_object, optional_str
from gmlx_server.auxiliary.stt import Transcript
from gmlx_server.errors import InvalidRequest, clip

TEXT_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
GRANULARITIES = ("segment", "word")


@dataclass(frozen=True)
class Form:
    fields: dict[str, list[str]]
    file: bytes | None
    filename: str | None


def parse_form(content_type: str | None, raw: bytes) -> Form:
    """multipart/form-data -> text fields (repeatable) and the one `file` part."""
    if not content_type or not content_type.lower().startswith("multipart/form-data"):
        raise InvalidRequest(f"expected a multipart/form-data upload, got Content-Type {clip(str(content_type))!r}")
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + raw)
    if not msg.is_multipart():
        raise InvalidRequest("the multipart body could not be parsed (boundary missing or wrong)")
    fields: dict[str, list[str]] = {}
    file, filename = None, None
    for part in msg.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            continue
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        if name == "file":
            file, filename = data, part.get_filename()
        else:
            fields.setdefault(name, []).append(data.decode("utf-8", "replace"))
    return Form(fields, file, filename)


@dataclass(frozen=True)
class TranscriptionRequest:
    audio: bytes
    model: str | None
    language: str | None
    prompt: str | None
    response_format: str
    temperature: float | None
    words: bool


def _one(form: Form, name: str) -> str | None:
    values = form.fields.get(name)
    return values[-1] if values else None


def parse_transcription(form: Form, max_bytes: int) -> TranscriptionRequest:
    if form.file is None:
        raise InvalidRequest("'file' is required (the audio, as a multipart file part)", param="file")
    if len(form.file) > max_bytes:
        raise InvalidRequest(f"'file' is {len(form.file)} bytes, over the {max_bytes} allowed "
                             "(services.stt.max_file_bytes)", param="file")
    fmt = _one(form, "response_format") or "json"
    if fmt not in TEXT_FORMATS:
        raise InvalidRequest(f"'response_format' must be one of {', '.join(TEXT_FORMATS)}, not {clip(fmt)!r}",
                             param="response_format")
    temperature = None
    raw_t = _one(form, "temperature")
    if raw_t:
        try:
            temperature = float(raw_t)
        except ValueError:
            temperature = math.nan
        if not 0.0 <= temperature <= 1.0:
            raise InvalidRequest("'temperature' must be a number from 0 to 1", param="temperature")
    grains = form.fields.get("timestamp_granularities[]", []) + form.fields.get("timestamp_granularities", [])
    bad = [g for g in grains if g not in GRANULARITIES]
    if bad:
        raise InvalidRequest(f"'timestamp_granularities' takes segment and word, not {clip(bad[0])!r}",
                             param="timestamp_granularities")
    if grains and fmt != "verbose_json":
        raise InvalidRequest("'timestamp_granularities' needs response_format verbose_json",
                             param="timestamp_granularities")
    return TranscriptionRequest(form.file, _one(form, "model"), _one(form, "language") or None,
                                _one(form, "prompt") or None, fmt, temperature, "word" in grains)


def _stamp(seconds: float, sep: str) -> str:
    ms = round(seconds * 1000)
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def subtitles(t: Transcript, fmt: str) -> str:
    """SubRip (numbered cues, comma milliseconds) or WebVTT (a header, dot milliseconds)."""
    cues = []
    for i, seg in enumerate(t.segments, 1):
        sep = "," if fmt == "srt" else "."
        times = f"{_stamp(seg['start'], sep)} --> {_stamp(seg['end'], sep)}"
        cues.append(f"{i}\n{times}\n{seg['text'].strip()}\n" if fmt == "srt" else f"{times}\n{seg['text'].strip()}\n")
    return ("WEBVTT\n\n" if fmt == "vtt" else "") + "\n".join(cues)


def transcription_body(t: Transcript, req: TranscriptionRequest, task: str) -> tuple[str, bytes]:
    """(content type, body) in the requested response_format."""
    import json

    if req.response_format in ("text", "srt", "vtt"):
        text = t.text + "\n" if req.response_format == "text" else subtitles(t, req.response_format)
        kind = "text/vtt" if req.response_format == "vtt" else "text/plain"
        return f"{kind}; charset=utf-8", text.encode()
    body: dict[str, Any] = {"text": t.text, "usage": {"type": "duration", "seconds": math.ceil(t.duration)}}
    if req.response_format == "verbose_json":
        body = {"task": task, "language": t.language, "duration": t.duration, "text": t.text,
                "segments": t.segments, **({"words": t.words} if req.words else {}), "usage": body["usage"]}
    return "application/json", json.dumps(body, ensure_ascii=False).encode()


@dataclass(frozen=True)
class SpeechRequest:
    model: str | None
    text: str
    voice: str | None
    response_format: str
    speed: float


def parse_speech(body: Any, max_chars: int) -> SpeechRequest:
    b: Mapping[str, Any] = body_object(body)
    text = b.get("input")
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest("'input' must be a non-empty string", param="input")
    if len(text) > max_chars:
        raise InvalidRequest(f"'input' is {len(text)} characters, over the {max_chars} allowed "
                             "(services.tts.max_input_chars)", param="input")
    fmt = b.get("response_format") or "mp3"
    if fmt not in SPEECH_FORMATS:
        raise InvalidRequest(f"'response_format' must be one of {', '.join(SPEECH_FORMATS)}, not "
                             f"{clip(str(fmt))!r}", param="response_format")
    speed = b.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not 0.25 <= speed <= 4.0:
        raise InvalidRequest("'speed' must be a number from 0.25 to 4.0", param="speed")
    return SpeechRequest(optional_str(b, "model"), text, optional_str(b, "voice"), fmt, float(speed))
