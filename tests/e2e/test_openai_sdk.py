"""The official openai SDK against a real `gmlx serve` process serving the real default model (SmolLM2)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.server import LiveServer, gmlx_serve

pytestmark = pytest.mark.slow
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    logs = tmp_path_factory.mktemp("serve")
    with gmlx_serve([], logs, env={"GMLX_MAX_BODY_BYTES": "200000", "TOP_LOGPROBS_K": "5"}) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)


def test_chat_non_streaming_answers_paris(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="", messages=QUESTION, temperature=0, max_tokens=32)  # type: ignore[arg-type]
    assert "Paris" in (r.choices[0].message.content or "")
    assert r.choices[0].finish_reason == "stop"
    assert r.usage is not None and r.usage.prompt_tokens > 10 and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streaming_reassembles_with_usage(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0,  # type: ignore[arg-type]
                                           max_tokens=24)
    chunks = list(client.chat.completions.create(
        model="smollm2", messages=QUESTION, temperature=0, max_tokens=24, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1 and not chunks[-1].choices
    assert usage[0].completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]


def test_completions_continue_text(client: openai.OpenAI) -> None:
    r = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=8, temperature=0)
    assert r.choices[0].text.strip() != ""
    assert r.choices[0].finish_reason in ("length", "stop")


def test_models_lists_the_default_with_markers(client: openai.OpenAI) -> None:
    models = client.models.list().data
    entry = next(m for m in models if m.id == "smollm2")
    extra = entry.model_dump()
    for marker in ("resident", "pinned", "speculative", "vlm", "profile", "default"):
        assert marker in extra
    assert extra["default"] is True and extra["context_length"] == 8192


def test_typed_errors_surface_as_sdk_exceptions(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        client.chat.completions.create(model="no-such-model", messages=QUESTION)  # type: ignore[arg-type]
    assert "smollm2" in str(nf.value.body)
    with pytest.raises(openai.BadRequestError) as bp:
        client.chat.completions.create(model="smollm2", messages=QUESTION,  # type: ignore[arg-type]
                                       extra_body={"profile": "nope"})
    assert "unknown_profile" in str(bp.value.body)
    with pytest.raises(openai.BadRequestError) as ov:
        client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=100_000)  # type: ignore[arg-type]
    assert "prompt is too long" in str(ov.value.body)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="smollm2", prompt=["a", "b"], max_tokens=4)


@pytest.mark.parametrize("body, status", [
    (b"{not json", 400),
    (b'{"model": "smollm2", "messages": []}', 400),
    (b'{"model": "smollm2", "messages": "hi"}', 400),
    (b'{"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}', 400),
    (b'{"model": "smollm2", "messages": [{"role": "user", "content": "\xff\xfe"}]}', 400),
    (b'{"model": "smollm2", "messages": [{"role": "user", "content": "' + b"x" * 300_000 + b'"}]}', 413),
])
def test_bad_input_gets_a_typed_4xx_and_the_server_stays_healthy(server: LiveServer, body: bytes,
                                                                 status: int) -> None:
    r = httpx.post(server.v1 + "/chat/completions", content=body,
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] and err["message"]
    assert httpx.get(server.base_url + "/health", timeout=5).json()["status"] == "healthy"


def test_api_key_is_required_everywhere_but_health(tmp_path: Path) -> None:
    with gmlx_serve(["--api-key", "s3cret"], tmp_path) as s:
        assert httpx.get(s.base_url + "/health", timeout=5).status_code == 200
        bad = openai.OpenAI(base_url=s.v1, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        good = openai.OpenAI(base_url=s.v1, api_key="s3cret", max_retries=0, timeout=120)
        assert any(m.id == "smollm2" for m in good.models.list().data)
        r = httpx.get(s.v1 + "/models", headers={"x-api-key": "s3cret"}, timeout=5)
        assert r.status_code == 200
