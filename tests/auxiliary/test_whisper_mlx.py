"""mlx-audio's Whisper backend on an MLX directory: Whisper tiny.en converted from the packaged CTranslate2
weights, served by a real `gmlx serve` and called with the openai SDK; it must hear Piper's speech as well as
the CTranslate2 backend does on the same audio."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gmlx_server.auxiliary.backends import load_transcriber
from gmlx_server.auxiliary.stt import Ct2Transcriber
from tests.auxiliary.conftest import SENTENCE, piper_voice, whisper_tiny_dir, write_config
from tests.auxiliary.test_audio_real import assert_words_heard, transcribe, wer
from tests.e2e.server import LiveServer, gmlx_serve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, whisper_tiny_mlx: Path) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("mlx-whisper")
    cfg = write_config(tmp, f"  stt: {{model: '{whisper_tiny_mlx}', id: tiny-mlx, aliases: [whisper-1]}}\n"
                            f"  tts: {{model: '{piper_voice()}', aliases: [tts-1]}}\n")
    with gmlx_serve(["--config", str(cfg)], tmp) as live:
        yield live


def test_mlx_whisper_hears_what_ctranslate2_hears(server: LiveServer, client: openai.OpenAI, wav: bytes) -> None:
    text = transcribe(client, wav).text  # type: ignore[attr-defined]
    ct2 = Ct2Transcriber(whisper_tiny_dir(), "int8")
    reference = ct2.transcribe(ct2.decode(wav, 60), "transcribe", None, None, None, False).text
    print(f"mlx-audio: {text!r} (WER {wer(SENTENCE, text):.3f}); faster-whisper: {reference!r}")
    assert wer(SENTENCE, text) < 0.2 and wer(reference, text) < 0.1
    row = next(m for m in httpx.get(server.v1 + "/models").json()["data"] if m["id"] == "tiny-mlx")
    assert row["kind"] == "stt" and row["backend"] == "mlx-audio" and row["resident"]


def test_mlx_whisper_timestamps_and_subtitles(client: openai.OpenAI, wav: bytes) -> None:
    verbose = transcribe(client, wav, response_format="verbose_json", timestamp_granularities=["word", "segment"])
    v = verbose.model_dump()  # type: ignore[attr-defined]
    assert v["language"] == "en" and v["segments"] and all(s["start"] < s["end"] for s in v["segments"])
    assert all(s["tokens"] and s["avg_logprob"] < 0 for s in v["segments"])
    assert_words_heard(v)
    assert all(a["start"] <= a["end"] <= b["start"] + 1e-6 for a, b in zip(v["words"], v["words"][1:], strict=False))
    assert v["words"][-1]["end"] <= v["duration"] + 0.05
    srt = str(transcribe(client, wav, response_format="srt"))
    assert re.fullmatch(r"(\d+\n\d\d:\d\d:\d\d,\d{3} --> \d\d:\d\d:\d\d,\d{3}\n.+\n\n?)+", srt), srt


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the SDK marks translations so
def test_mlx_whisper_refuses_what_english_only_cannot_do(client: openai.OpenAI, wav: bytes) -> None:
    with pytest.raises(openai.BadRequestError, match="English-only"):
        client.audio.translations.create(model="whisper-1", file=("a.wav", wav))
    with pytest.raises(openai.BadRequestError, match="English-only") as err:
        transcribe(client, wav, language="fr")
    assert err.value.body["param"] == "language"  # type: ignore[index]


def test_the_converted_directory_is_what_mlx_audio_itself_loads(whisper_tiny_mlx: Path) -> None:
    from mlx_audio.stt import load

    model = load(str(whisper_tiny_mlx), strict=True)  # every weight named as mlx-audio expects
    assert model.dims.n_vocab == 51864 and not model.is_multilingual
    assert model.get_tokenizer().timestamp_begin == 50363  # <|0.00|>, added from the vocabulary


def test_compute_type_int8_quantizes_the_weights_and_still_hears(whisper_tiny_mlx: Path, wav: bytes) -> None:
    import mlx.nn as nn

    model = load_transcriber(whisper_tiny_mlx, "int8")
    layers = [m for _, m in model.model.named_modules()]  # type: ignore[attr-defined]
    assert any(isinstance(m, nn.QuantizedLinear) for m in layers)
    assert not any(type(m) is nn.Linear for m in layers)
    text = model.transcribe(model.decode(wav, 60), "transcribe", "en", None, None, False).text
    assert wer(SENTENCE, text) < 0.2, text


def test_multilingual_mlx_whisper_detects_translates_and_refuses_unknown_codes(
        tmp_path_factory: pytest.TempPathFactory, wav: bytes) -> None:
    from gmlx_server.errors import InvalidRequest
    from tests.auxiliary.conftest import whisper_base_dir
    from tests.auxiliary.ct2_to_mlx import convert

    model = load_transcriber(convert(whisper_base_dir(), tmp_path_factory.mktemp("whisper-base-mlx")))
    assert model.backend == "mlx-audio" and model.multilingual
    audio = model.decode(wav, 60)
    heard = model.transcribe(audio, "transcribe", None, None, None, False)  # the language detected
    assert heard.language == "en" and wer(SENTENCE, heard.text) < 0.2, heard
    translated = model.transcribe(audio, "translate", "en", None, None, False)
    assert wer(SENTENCE, translated.text) < 0.2, translated
    with pytest.raises(InvalidRequest, match="'xx' is not a Whisper language code") as err:
        model.transcribe(audio, "transcribe", "xx", None, None, False)
    assert err.value.param == "language"
