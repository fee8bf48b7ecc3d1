"""Speech and transcription on the real Piper voice and Whisper tiny.en over real HTTP with the openai SDK: the
round trip, every speech format, the transcription formats, typed 400s, and a burst over the cap beside chat."""

from __future__ import annotations

import io
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import av
import httpx
import numpy as np
import openai
import pytest

from gmlx_server.auxiliary.audio_out import wav_header
from tests.auxiliary.conftest import SENTENCE, piper_voice, whisper_tiny_dir, write_config
from tests.e2e.server import LiveServer, gmlx_serve

pytestmark = pytest.mark.slow
LONG = " ".join(["Speech recognition turns spoken words into written text, one sentence after another."] * 5)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("audio")
    cfg = write_config(tmp, f"  stt: {{model: '{whisper_tiny_dir()}', id: tiny.en, aliases: [whisper-1], "
                            "max_concurrent: 1, max_audio_s: 60, max_file_bytes: 3MiB}\n"
                            f"  tts: {{model: '{piper_voice()}', id: joe, aliases: [tts-1]}}\n")
    with gmlx_serve(["--config", str(cfg)], tmp) as live:
        yield live


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


def wer(ref: str, hyp: str) -> float:
    """Word error rate: word-level edit distance over the reference's length."""
    r, h = words(ref), words(hyp)
    d = list(range(len(h) + 1))
    for i, rw in enumerate(r, 1):
        prev, d[0] = d[0], i
        for j, hw in enumerate(h, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (rw != hw))
    return d[len(h)] / len(r)


def decoded_seconds(data: bytes) -> float:
    with av.open(io.BytesIO(data)) as c:
        stream = c.streams.audio[0]
        return sum(f.samples for f in c.decode(stream)) / stream.rate


def assert_words_heard(v: dict[str, Any]) -> None:
    """The timed words are the transcript's own and the sentence's, less one misheard word (tiny's noise)."""
    heard = " ".join(w["word"] for w in v["words"])
    assert wer(SENTENCE, heard) < 0.2 and words(heard) == words(v["text"])


def transcribe(client: openai.OpenAI, data: bytes, name: str = "speech.wav", **kw: object) -> object:
    return client.audio.transcriptions.create(model="whisper-1", file=(name, data), **kw)  # type: ignore[call-overload]


def test_round_trip_speech_to_text(client: openai.OpenAI, wav: bytes) -> None:
    assert wav[:4] == b"RIFF" and wav[8:12] == b"WAVE" and decoded_seconds(wav) > 3
    text = transcribe(client, wav).text  # type: ignore[attr-defined]
    print(f"round trip: {text!r}, WER {wer(SENTENCE, text):.3f}")
    assert wer(SENTENCE, text) < 0.2


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "pcm"])
def test_every_speech_format_decodes_and_transcribes(client: openai.OpenAI, wav: bytes, fmt: str) -> None:
    data = client.audio.speech.create(model="joe", voice="alloy", input=SENTENCE, response_format=fmt).content
    if fmt == "pcm":  # raw 24 kHz 16-bit: give it a header to decode
        data = wav_header(24_000, len(data)) + data
    assert abs(decoded_seconds(data) - decoded_seconds(wav)) < 0.15 * decoded_seconds(wav)
    assert wer(SENTENCE, transcribe(client, data, f"speech.{fmt}").text) < 0.2  # type: ignore[attr-defined]


def test_speech_streams_and_speed_shortens_it(server: LiveServer, wav: bytes) -> None:
    body = {"input": SENTENCE, "voice": "alloy", "response_format": "wav", "speed": 2.0}
    with httpx.stream("POST", server.v1 + "/audio/speech", json=body, timeout=300) as r:
        fast = r.read()
        assert r.headers["content-type"] == "audio/wav" and r.headers.get("transfer-encoding") == "chunked"
    assert decoded_seconds(fast) < 0.7 * decoded_seconds(wav)


def test_transcription_formats(client: openai.OpenAI, wav: bytes) -> None:
    srt = transcribe(client, wav, response_format="srt")
    assert re.fullmatch(r"(\d+\n\d\d:\d\d:\d\d,\d{3} --> \d\d:\d\d:\d\d,\d{3}\n.+\n\n?)+", str(srt)), srt
    vtt = str(transcribe(client, wav, response_format="vtt"))
    assert vtt.startswith("WEBVTT\n\n") and re.search(r"\d\d:\d\d:\d\d\.\d{3} --> \d\d:\d\d:\d\d\.\d{3}\n", vtt)
    text = transcribe(client, wav, response_format="text")
    assert wer(SENTENCE, str(text)) < 0.2
    verbose = transcribe(client, wav, response_format="verbose_json", timestamp_granularities=["word", "segment"])
    v = verbose.model_dump()  # type: ignore[attr-defined]
    assert v["language"] == "en" and v["duration"] == pytest.approx(decoded_seconds(wav), abs=0.05)
    assert v["segments"] and all(s["start"] < s["end"] for s in v["segments"])
    assert_words_heard(v)
    assert all(a["end"] <= b["start"] + 1e-6 for a, b in zip(v["words"], v["words"][1:], strict=False))


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the SDK marks translations so
def test_bad_uploads_are_typed_400s(server: LiveServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="not audio"):
        transcribe(client, b"# just some markdown\n" * 50, "notes.md")
    with pytest.raises(openai.BadRequestError, match="max_file_bytes"):
        transcribe(client, bytes(4 << 20), "big.wav")
    silence = wav_header(8_000, 61 * 16_000) + bytes(61 * 16_000)  # 61 s at 8 kHz, under the size cap
    with pytest.raises(openai.BadRequestError, match="max_audio_s"):
        transcribe(client, silence, "long.wav")
    with pytest.raises(openai.BadRequestError, match="English-only"):
        client.audio.translations.create(model="whisper-1", file=("a.wav", wav_header(16_000, 32_000) + bytes(32_000)))
    r = httpx.post(server.v1 + "/audio/transcriptions", json={"file": "x"})
    assert r.status_code == 400 and "multipart/form-data" in r.json()["error"]["message"]


def test_a_burst_over_the_cap_gets_503s_while_chat_streams(server: LiveServer, client: openai.OpenAI) -> None:
    long_wav = client.audio.speech.create(model="tts-1", voice="alloy", input=LONG, response_format="wav").content
    done, chunks_meanwhile = threading.Event(), []

    def chat() -> str:
        chat_client = openai.OpenAI(base_url=server.v1, api_key="unused", timeout=300)
        stream = chat_client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Count from one to fifty."}], max_tokens=60,
            stream=True, temperature=0)
        parts = []
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
                chunks_meanwhile.append(not done.is_set())
        return "".join(parts)

    def upload() -> httpx.Response:
        return httpx.post(server.v1 + "/audio/transcriptions", files={"file": ("long.wav", long_wav)}, timeout=300)

    with ThreadPoolExecutor(5) as pool:
        first = pool.submit(upload)
        while httpx.get(server.v1 + "/metrics").json()["server"]["services"]["stt"]["in_flight"] < 1:
            pass
        talk = pool.submit(chat)
        burst = [pool.submit(upload) for _ in range(3)]
        answers = [first.result(), *(f.result() for f in burst)]
        done.set()
        reply = talk.result()
    refused = [r for r in answers if r.status_code == 503]
    assert refused and all(r.status_code == 200 for r in answers if r not in refused)
    assert all(r.json()["error"]["type"] == "server_overloaded" and int(r.headers["Retry-After"]) >= 1
               for r in refused)
    assert reply and sum(chunks_meanwhile) >= 3, (reply, chunks_meanwhile)
    section = httpx.get(server.v1 + "/metrics").json()["server"]["services"]["stt"]
    assert section["rejections"] >= len(refused) and section["bytes_in"] > len(long_wav)  # the admitted ones
    assert np.isfinite(section["latency_s_recent"])
