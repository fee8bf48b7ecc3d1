"""Which backend a model directory gets, and the refusals that name what is served (no model loads here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gmlx_server.auxiliary.backends import load_transcriber
from gmlx_server.auxiliary.stt_mlx import dtype_for, is_mlx_whisper


def test_a_directory_that_is_neither_layout_names_both(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=r"neither CTranslate2 \(model.bin.*nor MLX"):
        load_transcriber(tmp_path)


def test_mlx_layout_needs_a_whisper_config_and_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "whisper", "n_audio_ctx": 1500}))
    assert not is_mlx_whisper(tmp_path)
    (tmp_path / "weights.npz").write_bytes(b"")
    assert is_mlx_whisper(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"n_audio_ctx": 1500}))  # older MLX exports: no model_type
    assert is_mlx_whisper(tmp_path)


def test_compute_type_on_mlx() -> None:
    assert dtype_for("auto", gpu=False) == ("float32", False) and dtype_for("auto", gpu=True) == ("float16", False)
    assert dtype_for("int8", gpu=False) == ("float32", True) and dtype_for("int8_float16", False) == ("float16", True)
    with pytest.raises(ValueError, match=r"services.stt.compute_type 'int16'.*auto, float32"):
        dtype_for("int16", gpu=False)


def test_tts_picks_mlx_audio_by_the_directory_and_refuses_what_it_does_not_serve(tmp_path: Path) -> None:
    from gmlx_server.auxiliary.backends import load_voice
    from gmlx_server.auxiliary.tts import voice_files
    from gmlx_server.auxiliary.tts_mlx import is_mlx_tts

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bark"}))
    assert not is_mlx_tts(tmp_path)  # no weights: not an mlx-audio directory, and no Piper voice either
    with pytest.raises(ValueError, match=r"holds 0 .onnx files and is not an mlx-audio directory"):
        voice_files(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert is_mlx_tts(tmp_path)
    with pytest.raises(ValueError, match=r"mlx-audio model of type 'bark'; services.tts serves Piper voices and "
                                         r"mlx-audio's kokoro"):
        load_voice(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"istftnet": {}, "plbert": {}, "vocab": {}}))  # hexgrad's
    (tmp_path / "voices").mkdir()
    (tmp_path / "voices" / "qq_nobody.safetensors").write_bytes(b"")  # no Kokoro language letter
    with pytest.raises(ValueError, match=r"holds no Kokoro voices \(voices/<name>.safetensors"):
        load_voice(tmp_path)


def test_piper_voice_names_a_speaker_only_on_a_multi_speaker_voice() -> None:
    from gmlx_server.auxiliary.tts import Voice
    from gmlx_server.errors import InvalidRequest

    voice = Voice.__new__(Voice)  # pick reads only the speaker map a loaded voice would have
    voice.speakers = {}
    assert voice.pick("alloy") is None and voice.pick(None) is None  # single speaker: any name, its own voice
    voice.speakers = {"amy": 0, "bob": 1}
    assert voice.pick("bob") == 1 and voice.pick(None) is None
    with pytest.raises(InvalidRequest, match=r"'voice' 'alloy' is not a speaker of this voice; it has: amy, bob"):
        voice.pick("alloy")
