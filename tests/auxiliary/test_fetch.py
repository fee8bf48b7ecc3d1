"""Service models named as hf: repos download in the background at start, from a loopback stand-in for the
Hub (HF_ENDPOINT): 503 + Retry-After while a download runs, the model served once it is in, and a download
that fails midway reported in /v1/models and the log while the server goes on serving."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.auxiliary.conftest import minilm_dir, piper_voice, write_config
from tests.auxiliary.hub import Hub, Repo, running_hub
from tests.e2e.server import LiveServer, gmlx_serve

pytestmark = pytest.mark.slow
POLL_LIMIT = 600  # bounded waits: polls of /v1/models, not a timed assertion


@pytest.fixture(scope="module")
def hub() -> Iterator[Hub]:
    voice = piper_voice()
    repos = {"acme/minilm": Repo.from_dir(minilm_dir(), hold=threading.Event()),
             "acme/whisper": Repo({"config.json": b"{}" * 500, "model.bin": b"\0" * 300_000}, cut=True),
             "acme/voices": Repo({f"en/{voice.name}": voice.read_bytes(),
                                  f"en/{voice.name}.json": voice.with_name(voice.name + ".json").read_bytes(),
                                  "other/unwanted.onnx": b"never fetched"})}
    with running_hub(Hub(repos)) as h:
        yield h


@pytest.fixture(scope="module")
def server(hub: Hub, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("fetch")
    cfg = write_config(tmp, "  embeddings: {model: 'hf:acme/minilm'}\n  stt: {model: 'hf:acme/whisper'}\n"
                            "  tts: {model: 'hf:acme/voices/en/en_US-joe-medium.onnx', load: start}\n")
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp / "hub-cache"), "HF_HUB_OFFLINE": "0"}
    with gmlx_serve(["--config", str(cfg)], tmp, env=env) as live:
        yield live


def rows(server: LiveServer) -> dict[str, dict[str, Any]]:
    return {r["kind"]: r for r in httpx.get(server.v1 + "/models").json()["data"]}


def wait_for(server: LiveServer, kind: str, states: tuple[str, ...]) -> dict[str, Any]:
    for _ in range(POLL_LIMIT):
        row = rows(server)[kind]
        if row["state"] in states:
            return row
        threading.Event().wait(0.1)
    raise AssertionError(f"{kind} never reached {states}: {rows(server)[kind]}")


def test_a_held_download_answers_503_with_retry_after(server: LiveServer) -> None:
    assert rows(server)["embeddings"]["state"] == "downloading"
    r = httpx.post(server.v1 + "/embeddings", json={"input": "hello"})
    assert r.status_code == 503 and r.json()["error"]["type"] == "model_load_deferred"
    assert int(r.headers["Retry-After"]) >= 1 and "hf:acme/minilm is downloading" in r.json()["error"]["message"]


def test_a_download_failing_midway_is_reported_and_the_server_serves_on(server: LiveServer) -> None:
    row = wait_for(server, "stt", ("failed",))
    assert "peer closed connection" in row["load_error"] and row["resident"] is False
    files = {"file": ("a.wav", b"RIFF")}
    r = httpx.post(server.v1 + "/audio/transcriptions", files=files)
    assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
    assert "downloading hf:acme/whisper failed" in r.json()["error"]["message"]
    assert "service stt: downloading hf:acme/whisper failed" in server.log()
    chat = httpx.post(server.v1 + "/chat/completions", timeout=120, json={
        "model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    assert chat.status_code == 200


def test_a_subpath_downloads_only_that_voice_and_loads_at_start(server: LiveServer, hub: Hub) -> None:
    row = wait_for(server, "tts", ("ready", "failed"))
    assert row["state"] == "ready" and row["resident"], row  # load: start, after its download
    speech = httpx.post(server.v1 + "/audio/speech", json={"input": "Downloaded.", "response_format": "wav"})
    assert speech.status_code == 200 and len(speech.content) > 10_000
    fetched = [r for r in hub.requests if r.startswith("GET /acme/voices/resolve/")]
    assert len(fetched) == 2 and not any("unwanted" in r for r in hub.requests)


def test_released_download_is_served_from_the_cache(server: LiveServer, hub: Hub) -> None:
    hold = hub.repos["acme/minilm"].hold
    assert hold is not None
    hold.set()
    wait_for(server, "embeddings", ("unloaded", "ready", "failed"))
    r = httpx.post(server.v1 + "/embeddings", json={"input": ["a cat sat", "a kitten sat", "stock prices"]})
    assert r.status_code == 200, r.text
    v = [d["embedding"] for d in r.json()["data"]]
    dot = [sum(a * b for a, b in zip(v[0], x, strict=True)) for x in v[1:]]
    assert dot[0] > dot[1] + 0.3
    assert rows(server)["embeddings"]["state"] == "ready"
    assert (Path(server.log_path).parent / "hub-cache" / "models--acme--minilm" / "snapshots").is_dir()
    files = [r for r in hub.requests if "/resolve/" in r]  # the service repos only: never the chat model
    assert files and all(r.split()[1].startswith("/acme/") for r in files)
