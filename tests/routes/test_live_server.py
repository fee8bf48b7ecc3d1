"""A real uvicorn serving the fake engine: the official openai SDK, and client disconnects."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest

from gmlx_server.config import RuntimeEnv
from tests.fakes import FakeBehavior, FakeFactory
from tests.routes.conftest import Served, ThreadedServer, make_config, serve

KEY = "sdk-key"


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[openai.OpenAI, Served]]:
    s = serve(make_config(("m1", "m2"), default="m1", api_key=KEY, env=RuntimeEnv(sse_keepalive_s=0.05)))
    with ThreadedServer(s.app) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0), s


def test_sdk_chat_and_stream(live: tuple[openai.OpenAI, Served]) -> None:
    client, _ = live
    r = client.chat.completions.create(model="m1", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "Hello, world!" and r.usage is not None
    stream = client.chat.completions.create(model="m1", messages=[{"role": "user", "content": "hi"}],
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello, world!"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


def test_sdk_extra_body_profile_and_completions(live: tuple[openai.OpenAI, Served]) -> None:
    client, s = live
    r = client.chat.completions.create(model="m2", messages=[{"role": "user", "content": "hi"}],
                                       temperature=0.1, extra_body={"profile": "creative"})
    assert r.model == "m2" and s.engine("m2").submitted[-1].sampling.temperature == 0.1
    c = client.completions.create(model="m1", prompt="Once", max_tokens=2)
    assert c.choices[0].text == "Hello," and c.choices[0].finish_reason == "length"


def test_sdk_models_and_errors(live: tuple[openai.OpenAI, Served]) -> None:
    client, _ = live
    assert [m.id for m in client.models.list()] == ["m1", "m2"]
    assert client.models.retrieve("m2").id == "m2"
    with pytest.raises(openai.NotFoundError) as nf:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert nf.value.body["type"] == "model_not_found"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="m1", messages=[], max_tokens=1)
    assert bad.value.body["param"] == "messages"  # type: ignore[index]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=str(client.base_url), api_key="wrong", max_retries=0).models.list()


def _eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False


def _wait_cancelled(s: Served, model: str = "m1") -> bool:
    def cancelled() -> bool:
        handles = s.factory.engines[model].handles
        return bool(handles) and handles[-1].cancelled

    return _eventually(cancelled)


def test_disconnect_cancels_stream_and_non_stream() -> None:
    s = serve(make_config(env=RuntimeEnv(sse_keepalive_s=0.05)),
              FakeFactory(FakeBehavior(pieces=["x"] * 1000, token_s=0.02)))
    body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with ThreadedServer(s.app) as url:
        with httpx.Client(base_url=url) as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
            next(r.iter_lines())
        assert _wait_cancelled(s)
        with httpx.Client(base_url=url, timeout=0.3) as c, pytest.raises(httpx.ReadTimeout):
            c.post("/v1/chat/completions", json={**body, "stream": False})
        assert _wait_cancelled(s)
        # a cancelled run leaves the running set when its generator next wakes, just after the flag is set
        assert _eventually(lambda: not s.engine().running)
        with httpx.Client(base_url=url) as c:
            assert c.get("/health").json()["status"] == "healthy"
    assert s.engine().closed  # the lifespan shutdown closed the engine
