"""Model files that cannot load, against a real `gmlx serve --config` and the real engine factory: a truncated
copy of SmolLM2, a text file named .gguf, a GGUF of an architecture the engine does not implement, a file
deleted after start and a repo id. Each is a typed answer the official SDKs surface (503 model_load_failed
naming what is wrong, or the loader's 403), never a 500; the good model beside them serves throughout.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import numpy as np
import openai
import pytest
from gguf import GGMLQuantizationType as QT

from tests.conftest import smollm2_path
from tests.e2e.server import LiveServer, gmlx_serve
from tests.gguf_factory import FakeTensor, write_gguf

pytestmark = pytest.mark.slow
TIMEOUT = httpx.Timeout(300)
CONFIG = """server:
  default_model: truncated
models:
  good:
    path: {good}
  truncated:
    path: {truncated}
  notes:
    path: {notes}
  odd:
    path: {odd}
  deleted:
    path: {deleted}
  repo:
    path: someorg/some-model-GGUF
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bad-models")
    with open(smollm2_path(), "rb") as f:
        (d / "truncated.gguf").write_bytes(f.read(3_000_000))  # the header, then a third of a tensor or so
    (d / "notes.gguf").write_text("my shopping list\n" * 20)
    write_gguf(d / "odd.gguf", [FakeTensor("w", np.zeros((4, 4), np.float32), QT.F32)], arch="mamba9")
    shutil.copyfile(smollm2_path(), d / "deleted.gguf")
    shutil.copyfile(smollm2_path(), d / "good.gguf")
    cfg = d / "gmlx.yaml"
    cfg.write_text(CONFIG.format(**{n: d / f"{n}.gguf" for n in ("good", "truncated", "notes", "odd", "deleted")}))
    return {"dir": d, "config": cfg}


@pytest.fixture(scope="module")
def server(files: dict[str, Path]) -> Iterator[LiveServer]:
    with gmlx_serve(["--config", str(files["config"])], files["dir"]) as live:
        (files["dir"] / "deleted.gguf").unlink()  # gone after start: the config check passed, the load cannot
        yield live


def chat(s: LiveServer, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2}
    return httpx.post(s.v1 + "/chat/completions", json=body, timeout=TIMEOUT)


def _load_failed(r: httpx.Response, *words: str) -> dict[str, Any]:
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["type"] == "model_load_failed" and err["code"] == "model_file_invalid" and err["param"] == "model"
    assert "Traceback" not in r.text
    for word in words:
        assert word in err["message"], err["message"]
    return dict(err)


WHAT = {"truncated": ("truncated: tensor", "file has 3000000"), "notes": ("bad magic", "b'my s'"),
        "odd": ("unsupported architecture 'mamba9'",), "deleted": ("cannot read", "No such file")}


def test_ready_says_model_while_the_default_models_file_cannot_load(server: LiveServer) -> None:
    r = httpx.get(server.base_url + "/health?ready=1", timeout=10)
    assert r.status_code == 503 and r.json()["reason"] == "model", r.text
    rows = {m["id"]: m for m in httpx.get(server.v1 + "/models", timeout=10).json()["data"]}
    assert rows["good"]["load_error"] is None
    for model, words in WHAT.items():
        assert all(w in rows[model]["load_error"] for w in words), rows[model]


@pytest.mark.parametrize("model", list(WHAT))
def test_each_bad_file_is_a_fast_typed_503_every_time(server: LiveServer, model: str) -> None:
    t0 = time.perf_counter()
    first = _load_failed(chat(server, model), f"model '{model}' cannot be loaded", *WHAT[model])
    took = time.perf_counter() - t0
    again = _load_failed(chat(server, model))
    assert again["message"] == first["message"]
    est = httpx.post(server.v1 + "/estimate", json={"model": model, "messages": [{"role": "user", "content": "x"}]},
                     timeout=TIMEOUT)
    _load_failed(est, *WHAT[model])
    _load_failed(httpx.post(server.v1 + "/keep", json={"model": model}, timeout=TIMEOUT), *WHAT[model])
    print(f"\n{model}: 503 in {took * 1e3:.1f} ms: {first['message']}")


def test_the_sdks_surface_the_typed_error(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="none", max_retries=0)
    with pytest.raises(openai.APIStatusError) as oe:
        client.chat.completions.create(model="truncated", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert oe.value.status_code == 503 and "truncated: tensor" in oe.value.message
    claude = anthropic.Anthropic(base_url=server.base_url, api_key="none", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as ae:
        claude.messages.create(model="notes", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert ae.value.status_code == 503 and "bad magic" in str(ae.value.body)


def test_a_repo_id_is_the_loaders_403(server: LiveServer) -> None:
    for r in (chat(server, "repo"), httpx.post(server.v1 + "/estimate", timeout=TIMEOUT,
                                               json={"model": "repo", "messages": [{"role": "user", "content": "x"}]})):
        assert r.status_code == 403 and r.json()["error"]["type"] == "hf_access_disabled", r.text


def test_reload_refuses_to_swap_a_working_model_for_a_broken_file(server: LiveServer, files: dict[str, Path]) -> None:
    assert chat(server, "good").status_code == 200  # loaded, serving
    config = files["config"]
    before = config.read_text()
    broken = files["dir"] / "truncated.gguf"
    config.write_text(f"models:\n  good:\n    path: {broken}\n")  # the only change a reload would make
    try:
        r = httpx.post(server.v1 + "/reload", timeout=TIMEOUT)
    finally:
        config.write_text(before)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_config" and err["param"] == "models.good.path"
    assert "reload refused, the running config is kept: model 'good' cannot be loaded" in err["message"]
    assert "truncated: tensor" in err["message"]
    answer = chat(server, "good")
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] is not None
    assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200
