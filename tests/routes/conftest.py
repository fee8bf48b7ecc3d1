"""Fixtures: an app over FakeEngines, an in-process client, and a real uvicorn server in a thread.

The in-process client is httpx over ASGITransport on one persistent loop: unlike falcon's
TestClient, which reports http.disconnect as soon as the body is sent, it reports it only
after the response completes, as a real client does (our routes cancel on disconnect).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, cast

import httpx
import pytest
import uvicorn

from gmlx_server.app import GmlxApp, create_app
from gmlx_server.config import ModelEntry, Profile, RuntimeEnv, ServerConfig, ServerSettings
from tests.fakes import FakeFactory


def make_config(models: tuple[str, ...] = ("m1",), *, default: str | None = None, api_key: str | None = None,
                profiles: dict[str, Profile] | None = None, aliases: dict[str, str] | None = None,
                env: RuntimeEnv | None = None, **entry_kw: Any) -> ServerConfig:
    entries = {m: ModelEntry(id=m, path=f"/fake/{m}.gguf", **entry_kw) for m in models}
    return ServerConfig(
        server=ServerSettings(api_key=api_key, default_model=default),
        models=MappingProxyType(entries), profiles=MappingProxyType(profiles or {}),
        aliases=MappingProxyType(aliases or {}), env=env or RuntimeEnv(sse_keepalive_s=0.05),
    )


class SyncClient:
    """Blocking calls into the ASGI app, all on one event loop (engines keep loop-bound state)."""

    def __init__(self, app: GmlxApp) -> None:
        self.runner = asyncio.Runner()
        transport = httpx.ASGITransport(app=cast(Any, app))
        self.client = httpx.AsyncClient(transport=transport, base_url="http://gmlx")

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return self.runner.run(self.client.request(method, path, **kw))

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("POST", path, **kw)

    def close(self) -> None:
        self.runner.run(self.client.aclose())
        self.runner.close()


@dataclass
class Served:
    app: GmlxApp
    client: SyncClient
    factory: FakeFactory
    config: ServerConfig

    def chat(self, body: dict[str, Any] | None = None, **kw: Any) -> httpx.Response:
        payload = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], **(body or {})}
        return self.client.post("/v1/chat/completions", json=payload, **kw)

    def engine(self, model: str = "m1") -> Any:
        return self.factory.engines[model]


def serve(config: ServerConfig | None = None, factory: FakeFactory | None = None) -> Served:
    config = config or make_config()
    factory = factory or FakeFactory()
    app = create_app(config, factory, check_headers=False)
    return Served(app, SyncClient(app), factory, config)


@pytest.fixture
def served() -> Iterator[Served]:
    s = serve()
    yield s
    s.client.close()


@pytest.fixture
def template_tools() -> Iterator[Served]:
    """A model with `tool_format: template`: a request's tools reach its template as sent (what the
    protocol converters hand templates), even though the fake template defines no call syntax."""
    s = serve(make_config(tool_format="template"))
    yield s
    s.client.close()


def sse_events(text: str) -> list[Any]:
    """data: payloads of an SSE body ('[DONE]' kept as a string), comments dropped."""
    out: list[Any] = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


class ThreadedServer:
    """uvicorn on 127.0.0.1 with a free port, in a background thread (for SDK and disconnect tests)."""

    def __init__(self, app: GmlxApp) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def live(request: pytest.FixtureRequest) -> Iterator[tuple[str, Served]]:
    """A real uvicorn serving a fake-engine app: (base_url, Served)."""
    cfg = make_config(env=RuntimeEnv(sse_keepalive_s=0.05))
    s = serve(cfg)
    with ThreadedServer(s.app) as url:
        yield url, s


class Lines(logging.Handler):
    """Collects the warning lines a logger emits (the ignored-parameter warning)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def app_and_log() -> Iterator[tuple[Served, Lines]]:
    s = serve(make_config())
    handler = Lines()
    logging.getLogger("gmlx.params").addHandler(handler)
    yield s, handler
    logging.getLogger("gmlx.params").removeHandler(handler)
    s.client.close()


__all__ = ["Served", "ThreadedServer", "make_config", "replace", "serve", "sse_events"]
