"""Long inputs on fake engines: refused before tokenizing when they cannot fit, and never rendered,
tokenized or converted on the event loop's thread (what keeps /health answering; the real server's
figures are in tests/e2e/test_responsiveness.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import pytest

from gmlx_server.app import create_app
from gmlx_server.config import ModelEntry, RuntimeEnv
from gmlx_server.serving import generation
from gmlx_server.serving.model_host import ModelHost
from tests.conftest import smollm2_path
from tests.fakes import FakeEngine, FakeFactory, FakeTemplate, FakeTokenizer
from tests.routes.conftest import Served, SyncClient, make_config

CONTEXT = 4096


class CountingTokenizer(FakeTokenizer):
    """One character per token, as the fake's; knows its bound and who called it."""

    max_token_chars = 1

    def __init__(self) -> None:
        self.threads: list[str] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.threads.append(threading.current_thread().name)
        return super().encode(text, add_special_tokens)


class ThreadTemplate(FakeTemplate):
    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def render(self, messages: Sequence[Mapping[str, object]], tools: Sequence[Mapping[str, object]] | None = None,
               add_generation_prompt: bool = True, **variables: object) -> str:
        self.threads.append(threading.current_thread().name)
        return super().render(messages, tools, add_generation_prompt, **variables)


@dataclass
class BoundFactory(FakeFactory):
    tokenizers: dict[str, CountingTokenizer] = field(default_factory=dict)

    def __call__(self, entry: ModelEntry, env: RuntimeEnv) -> FakeEngine:
        engine = super().__call__(entry, env)
        engine.tokenizer = self.tokenizers.setdefault(entry.id, CountingTokenizer())
        engine.template = ThreadTemplate()
        return engine


@pytest.fixture
def s() -> Iterator[Served]:
    cfg = make_config()
    factory = BoundFactory(context_length=CONTEXT)
    app = create_app(cfg, factory, check_headers=False)
    served = Served(app, SyncClient(app), factory, cfg)
    yield served
    served.client.close()


def _tokenizer(s: Served) -> CountingTokenizer:
    assert isinstance(s.factory, BoundFactory)
    return s.factory.tokenizers["m1"]


def _loop_thread(s: Served) -> str:
    return str(s.client.runner.run(_current_thread()))


async def _current_thread() -> str:
    return threading.current_thread().name


def _too_long(r: httpx.Response, anthropic: bool = False, param: str = "messages") -> dict[str, Any]:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["message"].startswith("prompt is too long")  # what agent clients match to compact
    if not anthropic:
        assert err["code"] == "context_length_exceeded" and err["param"] == param
    return dict(err)


LONG = {"role": "user", "content": "x" * (CONTEXT + 10)}
ROUTES = [
    ("/v1/chat/completions", {"messages": [LONG]}, False),
    ("/v1/messages", {"messages": [LONG], "max_tokens": 5}, True),
    ("/v1/messages/count_tokens", {"messages": [LONG]}, True),
    ("/v1/responses", {"input": [LONG]}, False),
    ("/v1/estimate", {"messages": [LONG]}, False),
    ("/v1/completions", {"prompt": LONG["content"]}, False),
]


@pytest.mark.parametrize(("path", "body", "anthropic"), ROUTES)
def test_a_text_longer_than_the_window_allows_is_refused_untokenized(s: Served, path: str, body: dict[str, Any],
                                                                      anthropic: bool) -> None:
    assert s.chat().status_code == 200  # loads the engine, tokenizing one short prompt
    tok = _tokenizer(s)
    before = len(tok.threads)
    field = next(k for k in ("prompt", "input", "messages") if k in body)  # each protocol's own name
    err = _too_long(s.client.post(path, json={"model": "m1", **body}), anthropic, field)
    assert len(tok.threads) == before  # refused on its length: never tokenized
    assert f"context window of {CONTEXT} tokens" in err["message"]
    if not anthropic:
        assert err["prompt_chars"] > CONTEXT and err["min_prompt_tokens"] >= CONTEXT
        assert err["context_budget"] == CONTEXT


def test_a_prompt_just_inside_the_bound_is_tokenized_and_counted(s: Served) -> None:
    body = {"model": "m1", "messages": [{"role": "user", "content": "x" * (CONTEXT // 2)}]}
    r = s.client.post("/v1/messages/count_tokens", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["input_tokens"] > CONTEXT // 2


def test_rendering_and_tokenizing_run_off_the_event_loop(s: Served) -> None:
    loop = _loop_thread(s)
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(200)]
    for path, body in (("/v1/chat/completions", {"messages": many}),
                       ("/v1/messages/count_tokens", {"messages": many}),
                       ("/v1/estimate", {"messages": many})):
        assert s.client.post(path, json={"model": "m1", **body}).status_code == 200, path
    engine = s.factory.engines["m1"]
    renders = engine.template.threads  # type: ignore[attr-defined]
    encodes = _tokenizer(s).threads
    assert renders and encodes
    assert loop not in renders and loop not in encodes


def test_more_messages_than_the_limit_is_refused_before_any_work(s: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generation, "MAX_MESSAGES", 50)
    many = [{"role": ("user", "assistant")[i % 2], "content": "hi"} for i in range(51)]  # no turns to merge
    for path, anthropic in (("/v1/chat/completions", False), ("/v1/messages", True),
                            ("/v1/messages/count_tokens", True), ("/v1/estimate", False)):
        body = {"model": "m1", "messages": many, "max_tokens": 5}
        err = _too_long(s.client.post(path, json=body), anthropic)
        assert "51 messages, more than the 50" in err["message"]
    assert s.factory.calls == 0  # no model loaded for it
    r = s.client.post("/v1/responses", json={"model": "m1", "input": many})
    assert "51 messages" in _too_long(r)["message"]


def test_the_message_limit_is_a_hundred_thousand(s: Served) -> None:
    many = [{"role": ("user", "assistant")[i % 2], "content": ""} for i in range(generation.MAX_MESSAGES + 1)]
    body = {"model": "m1", "messages": many}
    assert generation.MAX_MESSAGES == 100_000
    assert "100001 messages" in _too_long(s.client.post("/v1/chat/completions", json=body))["message"]


def test_estimate_of_a_model_not_loaded_bounds_by_its_gguf_vocabulary() -> None:
    """SmolLM2's longest token is 81 characters: 8192 x 81 characters cannot fit, one fewer can be counted."""
    cfg = make_config(env=RuntimeEnv(sse_keepalive_s=0.05))
    cfg = replace(cfg, models={m: replace(e, path=smollm2_path()) for m, e in cfg.models.items()})
    app = create_app(cfg, host=ModelHost(cfg, FakeFactory(), check_headers=False))
    client = SyncClient(app)
    try:
        far = {"model": "m1", "messages": [{"role": "user", "content": "a " * (8192 * 81 // 2)}]}
        err = _too_long(client.post("/v1/estimate", json=far))
        assert "no token of model 'm1' spans more than 81 characters" in err["message"]
        near = {"model": "m1", "messages": [{"role": "user", "content": "a " * 20_000}]}
        r = client.post("/v1/estimate", json=near)
        assert r.status_code == 200 and r.json()["context_ok"] is False and r.json()["prompt_tokens"] > 8192
    finally:
        client.close()


def test_a_large_body_is_converted_off_the_event_loop(s: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    from gmlx_server.protocol.anthropic import parse_messages
    from gmlx_server.routes import messages, parsing

    seen: list[str] = []

    def recording(raw: Any) -> Any:
        seen.append(threading.current_thread().name)
        return parse_messages(raw)

    monkeypatch.setattr(messages, "parse_messages", recording)
    small = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
    large = {**small, "metadata": {"pad": "y" * parsing.OFF_LOOP_BODY_BYTES}}  # a large body, a short prompt
    for body in (small, large):
        assert s.client.post("/v1/messages/count_tokens", json=body).status_code == 200
    assert seen == [_loop_thread(s), seen[1]] and seen[1] != seen[0]
