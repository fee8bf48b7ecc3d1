"""mlx-audio's Kokoro behind /v1/audio/speech, on a tiny random-weight Kokoro directory (no MLX voice ships in a
package here): over real HTTP with the openai SDK, gmlx's audio equals what mlx-audio's own generate API speaks for
the same directory, text, voice and speed; every format decodes to that length; bad requests are typed 400s."""

from __future__ import annotations

import importlib.util
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import openai
import pytest

from gmlx_server.auxiliary.audio_out import wav_header
from gmlx_server.auxiliary.tts_mlx import SEED, english_g2p_missing
from tests.auxiliary.conftest import write_config
from tests.auxiliary.tiny_kokoro import tiny_kokoro
from tests.e2e.server import LiveServer, gmlx_serve

pytestmark = pytest.mark.slow
SPANISH = "Hola, amigo.\nBuenos días."  # two lines: mlx-audio speaks (and gmlx streams) two segments
FRENCH = "Bonjour, mon ami."


@pytest.fixture(scope="module")
def kokoro() -> Path:
    return tiny_kokoro()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, kokoro: Path) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("kokoro")
    cfg = write_config(tmp, f"  tts: {{model: '{kokoro}', id: kokoro, aliases: [tts-1]}}\n")
    with gmlx_serve(["--config", str(cfg)], tmp) as live:
        yield live


@pytest.fixture(scope="module")
def reference(kokoro: Path) -> Any:
    """mlx-audio's own loader and generate API in this process: float samples at 24 kHz."""
    import mlx.core as mx
    from mlx_audio.tts.utils import load_model

    model = load_model(kokoro)

    def speak(text: str, voice: str, speed: float = 1.0) -> np.ndarray:
        mx.random.seed(SEED)
        parts = [np.asarray(r.audio) for r in model.generate(text, voice=voice, speed=speed, lang_code=voice[0])]
        return np.concatenate(parts).reshape(-1)

    return speak


def samples(wav: bytes) -> np.ndarray:
    """A streamed WAV's 16-bit samples as floats (its header says 'to the end of the stream')."""
    assert wav[:4] == b"RIFF" and wav[36:40] == b"data"
    return np.frombuffer(wav[44:], dtype="<i2").astype(np.float32) / 32767


def assert_same_speech(got: np.ndarray, want: np.ndarray) -> None:
    want = np.clip(want, -1, 1)
    assert np.sqrt(np.mean(want ** 2)) > 1e-3 and np.mean(np.abs(want) >= 1) < 0.01  # speech, barely clipped
    assert got.shape == want.shape
    assert np.max(np.abs(got - want)) <= 2 / 32767  # one step of 16-bit rounding, and a spare


def decoded(data: bytes) -> tuple[np.ndarray, int]:
    with av.open(io.BytesIO(data)) as c:
        stream = c.streams.audio[0]
        frames = [f.to_ndarray().reshape(-1) for f in c.decode(stream)]
        return np.concatenate(frames), int(stream.rate)


@pytest.fixture(scope="module")
def wav(client: openai.OpenAI) -> bytes:
    return client.audio.speech.create(model="kokoro", voice="ef_uno", input=SPANISH, response_format="wav").content


def test_speech_equals_mlx_audio_generate(wav: bytes, reference: Any) -> None:
    assert_same_speech(samples(wav), reference(SPANISH, "ef_uno"))


def test_speed_is_honoured_as_mlx_audio_does(server: LiveServer, reference: Any) -> None:
    body = {"model": "tts-1", "input": FRENCH, "voice": "ff_trois", "response_format": "wav", "speed": 2.0}
    with httpx.stream("POST", server.v1 + "/audio/speech", json=body, timeout=300) as r:
        fast = r.read()
        assert r.headers["content-type"] == "audio/wav" and r.headers.get("transfer-encoding") == "chunked"
    want = reference(FRENCH, "ff_trois", 2.0)
    assert_same_speech(samples(fast), want)
    assert len(want) < 0.7 * len(reference(FRENCH, "ff_trois"))


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "pcm"])
def test_every_format_decodes_to_the_speech(client: openai.OpenAI, wav: bytes, fmt: str) -> None:
    data = client.audio.speech.create(model="kokoro", voice="ef_uno", input=SPANISH, response_format=fmt).content
    if fmt == "pcm":  # raw 24 kHz 16-bit (the voice's own rate): give it a header to decode
        data = wav_header(24_000, len(data)) + data
    got, rate = decoded(data)
    want = samples(wav)
    assert abs(len(got) / rate - len(want) / 24_000) < 0.1
    if fmt in ("flac", "pcm"):  # lossless at the voice's rate: the very samples
        np.testing.assert_array_equal(got.astype(np.float32) / 32767, want)


def test_bad_requests_are_typed_400s(server: LiveServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match=r"'voice' 'alloy' is not a voice.*ef_uno, ff_trois") as bad:
        client.audio.speech.create(model="kokoro", voice="alloy", input="Hola.")
    assert bad.value.body["param"] == "voice"  # type: ignore[index]
    cases = [({"input": "Hola."}, "voice", "'voice' is required"),
             ({"input": "Hola.", "voice": "ef_uno", "response_format": "ogg"}, "response_format", "must be one of wav"),
             ({"input": "Hola.", "voice": "ef_uno", "speed": 5}, "speed", "0.25 to 4.0")]
    if why := english_g2p_missing():  # no spaCy English model here: the English voice says so, by name
        cases.append(({"input": "Hello.", "voice": "af_one"}, "voice", why))
    if importlib.util.find_spec("pyopenjtalk") is None:  # misaki's Japanese G2P cannot import: named, not a 500
        cases.append(({"input": "こんにちは。", "voice": "jf_yon"}, "voice", "misaki[ja]"))
    for body, param, said in cases:
        r = httpx.post(server.v1 + "/audio/speech", json=body, timeout=60)
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == param and said in err["message"], err
        assert err["type"] == "invalid_request_error"


def test_models_lists_the_mlx_audio_backend(server: LiveServer, wav: bytes) -> None:
    rows = {m["id"]: m for m in httpx.get(server.v1 + "/models").json()["data"]}
    assert rows["kokoro"]["kind"] == "tts" and rows["kokoro"]["backend"] == "mlx-audio"
    assert rows["tts-1"]["alias_of"] == "kokoro" and rows["kokoro"]["state"] == "ready"
