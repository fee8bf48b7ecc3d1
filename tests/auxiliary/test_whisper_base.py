"""The multilingual Whisper base (CTranslate2, assembled from two chunk packages): transcription and the
translations route, which the English-only tiny model refuses."""

from __future__ import annotations

import wave
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.auxiliary.conftest import piper_voice, whisper_base_dir, write_config
from tests.auxiliary.test_audio_real import SENTENCE, wer
from tests.e2e.server import LiveServer, gmlx_serve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("base")
    cfg = write_config(tmp, f"  stt: {{model: '{whisper_base_dir()}', id: whisper-base, load: start}}\n"
                            f"  tts: {{model: '{piper_voice().parent}'}}\n")  # a voice directory works too
    with gmlx_serve(["--config", str(cfg)], tmp) as live:
        yield live


def test_base_transcribes_and_translates(server: LiveServer, tmp_path: Path) -> None:
    speech = httpx.post(server.v1 + "/audio/speech", json={"input": SENTENCE, "response_format": "wav"},
                        timeout=300).content
    (tmp_path / "s.wav").write_bytes(speech)
    with wave.open(str(tmp_path / "s.wav")) as w:  # the streamed header's open sizes read as a plain WAV
        assert w.getframerate() == 22050 and w.getsampwidth() == 2
    for route in ("transcriptions", "translations"):
        r = httpx.post(f"{server.v1}/audio/{route}", files={"file": ("s.wav", speech)},
                       data={"response_format": "verbose_json", "language": "en"}, timeout=300)
        assert r.status_code == 200, r.text
        body = r.json()
        print(f"whisper base {route}: {body['text']!r}")
        assert body["task"] == route.rstrip("s").replace("transcription", "transcribe").replace("translation",
                                                                                                "translate")
        assert wer(SENTENCE, body["text"]) < 0.2
    row = next(m for m in httpx.get(server.v1 + "/models").json()["data"] if m["id"] == "whisper-base")
    assert row["kind"] == "stt" and row["load"] == "start" and row["resident"]
