"""SIGTERM's drain on a fake-engine app under a real uvicorn (DrainingServer): not ready, new POSTs refused
with typed 503s in each protocol's shape, the running stream finishes, then the server stops by itself."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import uvicorn

from gmlx_server.app import create_app
from gmlx_server.graceful import DrainingServer
from gmlx_server.serving.drain import SHED_GRACE_S, Drain
from gmlx_server.serving.model_host import ModelHost
from tests.fakes import FakeBehavior, FakeFactory
from tests.routes.conftest import make_config

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 50}
MESSAGES = {"model": "m1", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_drain_steps_wait_then_shed_once_then_exit() -> None:
    clock = Clock()
    drain = Drain(clock, deadline_s=10)
    assert drain.step(busy=True) == "wait" and not drain.active  # no drain before SIGTERM
    assert drain.begin() and not drain.begin()  # the second signal is not a second drain
    assert drain.step(busy=True) == "wait"
    clock.t += 9.9
    assert drain.step(busy=True) == "wait"
    clock.t += 0.1
    assert drain.step(busy=True) == "shed"
    assert drain.step(busy=True) == "wait"  # shed once, then the streams get their grace
    clock.t += SHED_GRACE_S
    assert drain.step(busy=True) == "exit"


def test_an_idle_host_exits_at_once() -> None:
    drain = Drain(Clock())
    drain.begin(5.0)
    assert drain.step(busy=False) == "exit" and drain.deadline_s == 5.0
    refusal = drain.refusal()
    assert refusal.status == 503 and refusal.type == "server_overloaded" and refusal.headers["Retry-After"] == "2"


@dataclass
class Running:
    url: str
    host: ModelHost
    server: DrainingServer
    thread: threading.Thread


@contextmanager
def draining_server(behavior: FakeBehavior, deadline_s: float) -> Iterator[Running]:
    """A real uvicorn (DrainingServer) in a thread over fake engines; signals are sent with handle_exit."""
    config = make_config()
    host = ModelHost(config, FakeFactory(behavior), check_headers=False, drain_deadline_s=deadline_s)
    server = DrainingServer(uvicorn.Config(create_app(config, host=host), host="127.0.0.1", port=0,
                                           log_level="warning", lifespan="on", timeout_graceful_shutdown=1), host)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield Running(f"http://127.0.0.1:{port}", host, server, thread)
    finally:
        server.should_exit = True
        thread.join(10)


class Stream(threading.Thread):
    """One streamed chat; `lines` holds its data lines, `error` what ended it otherwise."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.lines: list[str] = []
        self.error: httpx.HTTPError | None = None
        self.first = threading.Event()

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url + "/v1/chat/completions", json=CHAT, timeout=30) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.lines.append(line)
                        self.first.set()
        except httpx.HTTPError as e:
            self.error = e
        self.first.set()


def _streaming(run: Running) -> Stream:
    """A stream on `run`, once its first token is in."""
    stream = Stream(run.url)
    stream.start()
    assert stream.first.wait(10)
    return stream


def test_sigterm_drains_a_running_stream_then_exits() -> None:
    with draining_server(FakeBehavior(pieces=("tok",) * 20, token_s=0.1), deadline_s=30) as run:
        stream = _streaming(run)
        run.server.handle_exit(signal.SIGTERM, None)
        ready = httpx.get(run.url + "/health", params={"ready": "1"}, timeout=5)
        assert ready.status_code == 503 and ready.json()["reason"] == "draining"
        assert ready.headers["Retry-After"] == "2"
        chat = httpx.post(run.url + "/v1/chat/completions", json={**CHAT, "stream": False}, timeout=5)
        assert chat.status_code == 503 and chat.headers["Retry-After"] == "2"
        assert chat.json()["error"]["type"] == "server_overloaded" and "draining" in chat.json()["error"]["message"]
        msg = httpx.post(run.url + "/v1/messages", json=MESSAGES, timeout=5)
        assert msg.status_code == 503 and msg.json()["type"] == "error"
        assert msg.json()["error"]["type"] == "overloaded_error"  # Anthropic's name for it
        assert httpx.get(run.url + "/v1/metrics", timeout=5).status_code == 200  # GETs still answer
        assert run.server.started and not run.server.should_exit  # still serving while the stream runs
        stream.join(20)
        assert stream.error is None and stream.lines[-1] == "data: [DONE]"  # it finished
        run.thread.join(10)
        assert not run.thread.is_alive()  # then the server stopped by itself


def test_past_the_deadline_the_server_stops_anyway() -> None:
    """The fake engine cannot shed (the real one's typed error event is tests/fleet/test_fleet.py's): uvicorn's
    grace then cuts the stream."""
    with draining_server(FakeBehavior(pieces=("tok",) * 200, token_s=0.1), deadline_s=0.5) as run:
        stream = _streaming(run)
        run.server.handle_exit(signal.SIGTERM, None)
        run.thread.join(15)
        assert not run.thread.is_alive()  # the 20 s stream did not hold the stop
        stream.join(10)
        assert not stream.is_alive() and "data: [DONE]" not in stream.lines  # cut, not finished


def test_a_second_sigterm_stops_at_once() -> None:
    with draining_server(FakeBehavior(pieces=("tok",) * 200, token_s=0.1), deadline_s=60) as run:
        _streaming(run)
        run.server.handle_exit(signal.SIGTERM, None)
        assert not run.server.should_exit
        run.server.handle_exit(signal.SIGTERM, None)
        assert run.server.should_exit
