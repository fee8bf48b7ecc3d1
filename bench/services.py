"""The services' speed on a real `gmlx serve` over HTTP, each beside a peer run in the same process:

    .venv/bin/python bench/services.py [--repeat 3]

- embeddings per second at batch 1 and 32 (all-MiniLM-L6-v2 on MLX), beside sentence-transformers on torch;
- text-to-speech real-time factor (seconds of work per second of audio; under 1 is faster than real time) of
  the Piper voice through /v1/audio/speech, beside piper-tts called directly;
- speech-to-text real-time factor of Whisper tiny.en through /v1/audio/transcriptions, beside faster-whisper
  called directly on the same audio; then the same model converted to an MLX directory (mlx-audio's Whisper
  backend, float32 on the CPU), beside mlx-audio's own loader and generate;
- text-to-speech real-time factor of mlx-audio's Kokoro backend, on the tests' tiny random-weight Kokoro
  (Kokoro-82M's decoder widths, a small text side: no MLX voice ships in a package), beside mlx-audio's generate.
Medians of --repeat runs; the models are the packaged ones the tests use.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gmlx_server.startup import preload_blas
from tests.auxiliary.conftest import minilm_dir, piper_voice, whisper_tiny_dir, write_config
from tests.auxiliary.ct2_to_mlx import convert
from tests.auxiliary.tiny_kokoro import tiny_kokoro
from tests.e2e.server import gmlx_serve

TEXT = ("Local models answer without a network. The server keeps each service on a worker of its own, so a long "
        "transcription never holds up a chat stream. Speech comes back sentence by sentence as it is made.")
SPANISH = "Los modelos locales responden sin red. Cada servicio tiene un hilo propio."  # Kokoro's espeak G2P
SENTENCES = [f"Sentence {i}: the weather in city number {i} is mild with a light breeze." for i in range(32)]


def median_s(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def audio_seconds(wav: bytes) -> float:
    import av

    with av.open(io.BytesIO(wav)) as c:
        s = c.streams.audio[0]
        return sum(f.samples for f in c.decode(s)) / s.rate


def embeddings(base: str, repeat: int) -> None:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm_dir()), device="cpu")
    print(f"{'embeddings':12s} {'batch':>5s} {'gmlx /s':>9s} {'sentence-transformers /s':>26s}")
    for batch in (1, 32):
        texts = SENTENCES[:batch]
        httpx.post(base + "/v1/embeddings", json={"input": texts}, timeout=300)  # warm
        st.encode(texts)
        ours = median_s(lambda t=texts: httpx.post(base + "/v1/embeddings", json={"input": t}, timeout=300), repeat)
        peer = median_s(lambda t=texts: st.encode(t, batch_size=32), repeat)
        print(f"{'':12s} {batch:5d} {batch / ours:9.1f} {batch / peer:26.1f}")


def speech(base: str, repeat: int) -> bytes:
    from piper import PiperVoice

    voice = piper_voice()
    direct = PiperVoice.load(str(voice), config_path=str(voice.with_name(voice.name + ".json")))
    body = {"input": TEXT, "response_format": "wav"}
    wav = httpx.post(base + "/v1/audio/speech", json=body, timeout=300).content
    seconds = audio_seconds(wav)
    ours = median_s(lambda: httpx.post(base + "/v1/audio/speech", json=body, timeout=300).content, repeat)
    peer = median_s(lambda: [c.audio_int16_bytes for c in direct.synthesize(TEXT)], repeat)
    print(f"tts (Piper joe medium), {seconds:.1f} s of speech: real-time factor gmlx {ours / seconds:.3f}, "
          f"piper-tts directly {peer / seconds:.3f}")
    return wav


def kokoro_speech(base: str, repeat: int) -> None:
    from mlx_audio.tts.utils import load_model

    model = load_model(tiny_kokoro())
    body = {"input": SPANISH, "voice": "ef_uno", "response_format": "wav"}
    seconds = audio_seconds(httpx.post(base + "/v1/audio/speech", json=body, timeout=600).content)  # loads it
    list(model.generate(SPANISH, voice="ef_uno", lang_code="e"))  # warm
    ours = median_s(lambda: httpx.post(base + "/v1/audio/speech", json=body, timeout=600).content, repeat)
    peer = median_s(lambda: list(model.generate(SPANISH, voice="ef_uno", lang_code="e")), repeat)
    print(f"tts (tiny random Kokoro, mlx-audio), {seconds:.1f} s of speech: real-time factor gmlx "
          f"{ours / seconds:.3f}, mlx-audio directly {peer / seconds:.3f}")


def transcription(base: str, wav: bytes, repeat: int, label: str, peer_name: str,
                  peer: Callable[[], object]) -> None:
    seconds = audio_seconds(wav)
    files = {"file": ("speech.wav", wav)}
    httpx.post(base + "/v1/audio/transcriptions", files=files, timeout=300)  # loads the model
    ours = median_s(lambda: httpx.post(base + "/v1/audio/transcriptions", files=files, timeout=300), repeat)
    print(f"stt ({label}), {seconds:.1f} s of speech: real-time factor gmlx {ours / seconds:.3f}, "
          f"{peer_name} directly {median_s(peer, repeat) / seconds:.3f}")


def faster_whisper(wav: bytes) -> Callable[[], object]:
    from faster_whisper import WhisperModel

    model = WhisperModel(str(whisper_tiny_dir()), device="cpu", compute_type="int8")
    return lambda: list(model.transcribe(io.BytesIO(wav))[0])


def mlx_whisper(wav: bytes, mlx_dir: Path) -> Callable[[], object]:
    """mlx-audio's own loader and generate (float16, its default) on the converted directory."""
    from faster_whisper.audio import decode_audio
    from mlx_audio.stt import load

    model, audio = load(str(mlx_dir)), decode_audio(io.BytesIO(wav), sampling_rate=16_000)
    return lambda: model.generate(audio)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    preload_blas()  # before mlx loads in this process, as gmlx serve does, so the MLX peer gets OpenBLAS too
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        cfg = write_config(tmp, f"  embeddings: {{model: '{minilm_dir()}'}}\n"
                                f"  stt: {{model: '{whisper_tiny_dir()}'}}\n"
                                f"  tts: {{model: '{piper_voice()}'}}\n")
        with gmlx_serve(["--config", str(cfg)], tmp) as server:
            embeddings(server.base_url, args.repeat)
            wav = speech(server.base_url, args.repeat)
            transcription(server.base_url, wav, args.repeat, "Whisper tiny.en, CTranslate2 int8", "faster-whisper",
                          faster_whisper(wav))
        mlx_dir = convert(whisper_tiny_dir(), tmp / "whisper-tiny-mlx")
        (tmp / "mlx").mkdir()
        cfg = write_config(tmp / "mlx", f"  stt: {{model: '{mlx_dir}'}}\n  tts: {{model: '{tiny_kokoro()}'}}\n")
        with gmlx_serve(["--config", str(cfg)], tmp / "mlx") as server:
            transcription(server.base_url, wav, args.repeat, "Whisper tiny.en, MLX float32",
                          "mlx-audio (its float16 default)", mlx_whisper(wav, mlx_dir))
            kokoro_speech(server.base_url, args.repeat)


if __name__ == "__main__":
    main()
