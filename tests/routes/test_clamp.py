"""The opt-in max_tokens clamp: off, an oversized cap is a 400; on, it shrinks to what the window leaves."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from gmlx_server.config import RuntimeEnv, ServerConfig, load_config
from gmlx_server.serving.addressing import Catalog
from tests.fakes import FakeFactory
from tests.routes.conftest import Served, make_config, serve

WINDOW = 64
HI = [{"role": "user", "content": "hi"}]


def clamped_server(on: bool) -> Served:
    return serve(make_config(clamp_max_tokens=on), FakeFactory(context_length=WINDOW))


ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"messages": HI, "max_completion_tokens": 16384}),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 100, "stream": True}),
    ("/v1/messages", {"messages": HI, "max_tokens": 32000}),
    ("/v1/messages", {"messages": HI, "max_tokens": 32000, "stream": True}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 500}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 65}),
]


@pytest.mark.parametrize("path, body", ROUTES)
def test_clamp_on_lowers_the_cap_to_the_room_left_and_says_so(path: str, body: dict[str, Any],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    s = clamped_server(True)
    with caplog.at_level(logging.INFO, "gmlx.generate"):
        r = s.client.post(path, json={"model": "m1", **body})
    assert r.status_code == 200, r.text
    req = s.engine().submitted[-1]
    granted = WINDOW - len(req.prompt_tokens)
    assert req.max_tokens == granted and 0 < granted < WINDOW
    requested = next(v for k, v in body.items() if "max" in k)
    assert r.headers["x-gmlx-max-tokens"] == str(granted)
    assert r.headers["x-gmlx-max-tokens-requested"] == str(requested)
    lines = [rec.getMessage() for rec in caplog.records if "clamped" in rec.getMessage()]
    assert len(lines) == 1 and f"max_tokens {requested} clamped to {granted}" in lines[0]


@pytest.mark.parametrize("path, body", ROUTES)
def test_clamp_off_keeps_the_spec_400(path: str, body: dict[str, Any]) -> None:
    s = clamped_server(False)
    r = s.client.post(path, json={"model": "m1", **body})
    assert r.status_code == 400
    text = json.dumps(r.json())
    assert "prompt is too long" in text and "exceeds the context window" in text
    assert s.engine().submitted == [] and "x-gmlx-max-tokens" not in r.headers


def test_a_cap_that_fits_is_untouched_and_unreported() -> None:
    s = clamped_server(True)
    r = s.chat({"max_tokens": 5})
    assert r.status_code == 200 and s.engine().submitted[-1].max_tokens == 5
    assert "x-gmlx-max-tokens" not in r.headers


def test_clamp_cannot_rescue_a_prompt_that_fills_the_window() -> None:
    s = clamped_server(True)
    r = s.chat({"messages": [{"role": "user", "content": "x" * 200}], "max_tokens": 10})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("prompt is too long")
    assert s.engine().submitted == []


def _clamped(yaml_text: str, tmp_path: Any, env: RuntimeEnv | None = None) -> frozenset[str]:
    for name in ("a", "b"):
        (tmp_path / f"{name}.gguf").write_bytes(b"")
    cfg_file = tmp_path / "gmlx.yaml"
    cfg_file.write_text(yaml_text)
    cfg: ServerConfig = load_config(str(cfg_file), env=env)
    return Catalog.from_config(cfg).clamped


def test_server_wide_setting_env_override_and_per_model_setting(tmp_path: Any) -> None:
    models = "models:\n  a: {path: a.gguf}\n  b: {path: b.gguf, clamp_max_tokens: false}\n"
    assert _clamped(models, tmp_path) == frozenset()
    assert _clamped("server: {clamp_max_tokens: true}\n" + models, tmp_path) == {"a"}
    assert _clamped(models, tmp_path, RuntimeEnv(clamp_max_tokens=True)) == {"a"}
    on_b = "models:\n  a: {path: a.gguf}\n  b: {path: b.gguf, clamp_max_tokens: true}\n"
    assert _clamped("server: {clamp_max_tokens: true}\n" + models, tmp_path,
                    RuntimeEnv(clamp_max_tokens=False)) == frozenset()
    assert _clamped(on_b, tmp_path) == {"b"}
