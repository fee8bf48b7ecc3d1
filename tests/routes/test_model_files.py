"""A model file the server cannot load, on fake engines: a typed 503 that says what is wrong with the file,
remembered until the file changes, marked in /v1/models, refused by /v1/reload, and ready=1 says `model`.

The header check runs on real files written to tmp_path (a truncated copy of SmolLM2, a text file named
.gguf, a missing path, an unknown architecture); the engines behind a file that passes are fakes. The same
files against a real `gmlx serve` and the real engine factory: tests/e2e/test_bad_model_files.py.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from gmlx_plan.gguf_header import GGUFFormatError
from gmlx_server.app import create_app
from gmlx_server.config import ModelEntry, RuntimeEnv, load_config
from gmlx_server.serving.model_host import ModelHost
from tests.conftest import smollm2_path
from tests.fakes import FakeEngine, FakeFactory
from tests.gguf_factory import FakeTensor, write_gguf
from tests.routes.conftest import Served, SyncClient, make_config


def truncated_copy(path: Path, size: int = 2_000_000) -> Path:
    """The first `size` bytes of SmolLM2: the whole header, then tensor data that stops short."""
    with open(smollm2_path(), "rb") as f:
        path.write_bytes(f.read(size))
    return path


def host_for(paths: dict[str, Path], factory: FakeFactory | None = None, **kw: Any) -> tuple[Served, ModelHost]:
    """An app whose models are these files, loaded by a fake factory, with the header check on."""
    cfg = make_config(tuple(paths), env=RuntimeEnv(sse_keepalive_s=0.05), **kw)
    cfg = replace(cfg, models={m: replace(e, path=str(paths[m])) for m, e in cfg.models.items()})
    factory = factory or FakeFactory()
    host = ModelHost(cfg, factory, check_headers=True)  # as with the real factory
    app = create_app(cfg, host=host)
    return Served(app, SyncClient(app), factory, cfg), host


def _load_failed(r: Any, *words: str) -> dict[str, Any]:
    assert r.status_code == 503, r.text
    body = r.json()
    err = body["error"]
    assert err.get("type") == "model_load_failed" or err.get("code") == "model_load_failed", body
    assert "Traceback" not in r.text
    for word in words:
        assert word in err["message"], err["message"]
    return dict(err)


@pytest.fixture
def bad_files(tmp_path: Path) -> dict[str, Path]:
    text = tmp_path / "notes.gguf"
    text.write_text("these are my notes, not a model\n" * 10)
    odd = write_gguf(tmp_path / "odd.gguf", [FakeTensor("w", np.zeros((4, 4), np.float32), QT.F32)], arch="mamba9")
    return {"truncated": truncated_copy(tmp_path / "trunc.gguf"), "text": text,
            "missing": tmp_path / "nowhere.gguf", "odd": odd}


WHAT = {"truncated": ("truncated: tensor", "ends at byte", "file has 2000000"),
        "text": ("not a GGUF file (bad magic: it starts with b'thes', not b'GGUF')",),
        "missing": ("cannot read", "No such file"),
        "odd": ("unsupported architecture 'mamba9'",)}


def test_each_bad_file_is_a_typed_503_naming_the_problem_and_no_engine_is_made(bad_files: dict[str, Path]) -> None:
    s, _ = host_for(bad_files)
    for model, path in bad_files.items():
        err = _load_failed(s.chat({"model": model}), f"model '{model}' cannot be loaded", str(path), *WHAT[model])
        assert err["param"] == "model" and err["code"] == "model_file_invalid" and err["model"] == model
    assert s.factory.calls == 0  # the header check refused them all before any load
    r = s.client.post("/v1/messages", json={"model": "text", "max_tokens": 4,
                                            "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503 and r.json()["type"] == "error"  # the Anthropic shape
    assert r.json()["error"]["code"] == "model_load_failed" and "bad magic" in r.json()["error"]["message"]
    assert r.json()["error"]["type"] == "api_error"  # not overloaded_error: Claude Code would retry a broken file
    for route in ("/v1/keep", "/v1/messages/count_tokens", "/v1/responses"):
        body = {"model": "truncated", "messages": [{"role": "user", "content": "hi"}], "input": "hi"}
        _load_failed(s.client.post(route, json=body), "truncated")


def test_estimate_of_a_bad_file_is_the_same_503(bad_files: dict[str, Path]) -> None:
    s, _ = host_for(bad_files)
    for model in bad_files:
        r = s.client.post("/v1/estimate", json={"model": model, "messages": [{"role": "user", "content": "hi"}]})
        _load_failed(r, *WHAT[model])


def test_a_repo_id_path_is_the_loaders_403_everywhere() -> None:
    cfg = make_config(env=RuntimeEnv(sse_keepalive_s=0.05))
    cfg = replace(cfg, models={"m1": replace(cfg.models["m1"], path="someorg/some-model-GGUF")})
    app = create_app(cfg, FakeFactory(), check_headers=False)
    client = SyncClient(app)
    try:
        for path in ("/v1/chat/completions", "/v1/estimate", "/v1/keep"):
            r = client.post(path, json={"model": "m1", "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 403 and r.json()["error"]["type"] == "hf_access_disabled", (path, r.text)
    finally:
        client.close()


def test_a_failed_load_is_remembered_until_the_file_changes(tmp_path: Path) -> None:
    path = truncated_copy(tmp_path / "m.gguf")
    s, host = host_for({"m1": path})
    first = _load_failed(s.chat())
    again = _load_failed(s.chat())
    assert first["message"] == again["message"]
    shutil.copyfile(smollm2_path(), path)  # fixed: new size and modification time
    assert s.chat().status_code == 200 and s.factory.calls == 1
    assert host.files.problem("m1") is None


def test_a_load_failure_about_the_file_is_remembered_and_another_is_retried() -> None:
    class Failing(FakeFactory):
        exc: Exception = GGUFFormatError("/fake/m1.gguf", "truncated header (needs byte 99, file has 50)")

        def __call__(self, entry: ModelEntry, env: RuntimeEnv) -> FakeEngine:
            self.calls += 1
            raise self.exc

    factory = Failing()
    app = create_app(make_config(), factory, check_headers=False)
    s = Served(app, SyncClient(app), factory, make_config())
    _load_failed(s.chat(), "model 'm1' cannot be loaded: /fake/m1.gguf: truncated header (needs byte 99")
    _load_failed(s.chat(), "needs byte 99")
    assert factory.calls == 1  # the same (missing) file is not tried again
    factory2 = Failing()
    factory2.exc = MemoryError("out of memory while loading")
    app2 = create_app(make_config(), factory2, check_headers=False)
    s2 = Served(app2, SyncClient(app2), factory2, make_config())
    _load_failed(s2.chat(), "model 'm1' failed to load: out of memory")
    _load_failed(s2.chat())
    assert factory2.calls == 2  # memory may come back: tried again


def test_ready_says_model_while_the_default_models_file_cannot_load(tmp_path: Path) -> None:
    path = truncated_copy(tmp_path / "m.gguf")
    cfg = make_config(env=RuntimeEnv(sse_keepalive_s=0.05))
    cfg = replace(cfg, models={"m1": replace(cfg.models["m1"], path=str(path))})
    app = create_app(cfg, host=ModelHost(cfg))  # the real factory: the header check runs at start
    client = SyncClient(app)
    try:
        r = client.get("/health?ready=1")
        assert r.status_code == 503 and r.json()["reason"] == "model" and r.headers["Retry-After"] == "30"
        assert client.get("/health").status_code == 200  # alive all the same
        row = client.get("/v1/models").json()["data"][0]
        assert "truncated" in row["load_error"] and row["resident"] is False
        shutil.copyfile(smollm2_path(), path)
        assert client.get("/health?ready=1").status_code == 200  # the file changed: no longer known bad
        assert client.get("/v1/models").json()["data"][0]["load_error"] is None
    finally:
        client.close()


def test_ready_ignores_a_bad_file_that_is_not_the_default(bad_files: dict[str, Path]) -> None:
    s, _ = host_for({"good": Path(smollm2_path()), **bad_files}, default="good")
    _load_failed(s.chat({"model": "text"}))
    assert s.client.get("/health?ready=1").status_code == 200
    rows = {r["id"]: r["load_error"] for r in s.client.get("/v1/models").json()["data"]}
    assert rows["good"] is None and all(rows[m] and WHAT[m][0] in rows[m] for m in bad_files), rows


MODELS = "models:\n  a:\n    path: a.gguf\n"


@pytest.fixture
def yaml_host(tmp_path: Path) -> Iterator[tuple[Served, ModelHost, Path]]:
    shutil.copyfile(smollm2_path(), tmp_path / "a.gguf")
    truncated_copy(tmp_path / "broken.gguf")
    (tmp_path / "notes.gguf").write_text("not a model\n" * 10)
    write_gguf(tmp_path / "odd.gguf", [FakeTensor("w", np.zeros((4, 4), np.float32), QT.F32)], arch="mamba9")
    path = tmp_path / "gmlx.yaml"
    path.write_text(MODELS)
    cfg = load_config(str(path), env=RuntimeEnv(sse_keepalive_s=0.05))
    factory = FakeFactory()
    host = ModelHost(cfg, factory, check_headers=True)
    app = create_app(cfg, host=host)
    s = Served(app, SyncClient(app), factory, cfg)
    yield s, host, path
    s.client.close()


@pytest.mark.parametrize(("change", "model", "what"), [
    ("  a:\n    path: broken.gguf\n", "a", "truncated"),  # a working model swapped for a broken file
    (MODELS + "  b:\n    path: notes.gguf\n", "b", "bad magic"),  # a new model on a file that is not GGUF
    (MODELS + "  c:\n    path: odd.gguf\n", "c", "unsupported architecture 'mamba9'"),
])
def test_reload_refuses_a_file_that_fails_the_header_check(yaml_host: tuple[Served, ModelHost, Path], change: str,
                                                          model: str, what: str) -> None:
    s, host, path = yaml_host
    assert s.chat({"model": "a"}).status_code == 200
    engine = host.resident["a"]
    path.write_text(change if change.startswith("models") else "models:\n" + change)
    r = s.client.post("/v1/reload")
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_config" and err["param"] == f"models.{model}.path"
    assert err["message"].startswith(f"reload refused, the running config is kept: model '{model}' cannot be loaded")
    assert what in err["message"]
    assert list(host.config.models) == ["a"] and host.resident["a"] is engine  # the old engine keeps serving
    assert s.chat({"model": "a"}).status_code == 200
