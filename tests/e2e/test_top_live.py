"""`gmlx top` against a real `gmlx serve` (default model) with a stream decoding, driven by Textual's pilot."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import httpx
import pytest

from gmlx_top.app import TopApp
from gmlx_top.client import HttpClient
from gmlx_top.view import REQUEST_COLUMNS
from tests.e2e.server import LiveServer, gmlx_serve
from tests.top.fakes import SIZE

pytestmark = pytest.mark.slow
# EOS tokens of SmolLM2 (<|endoftext|>, <|im_end|>) banned, so the stream decodes until the test abandons it
# (64 tokens took ~1 s once decode got faster: over before top could ask to unload a busy model).
BODY = {"model": "smollm2", "messages": [{"role": "user", "content": "Tell me a story about a lighthouse."}],
        "max_tokens": 2048, "temperature": 0, "logit_bias": {"0": -100, "2": -100}, "stream": True}


class Stream(threading.Thread):
    """A streaming chat request; `started` is set at the first token, `stop` abandons the stream."""

    def __init__(self, server: LiveServer) -> None:
        super().__init__(daemon=True)
        self.server, self.started, self.stop = server, threading.Event(), threading.Event()

    def run(self) -> None:
        with httpx.stream("POST", self.server.v1 + "/chat/completions", json=BODY, timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and '"content"' in line:
                    self.started.set()
                if self.stop.is_set():
                    return


async def _wait_for_state(app: TopApp, state: str, timeout_s: float) -> list[str]:
    deadline = time.monotonic() + timeout_s
    states: list[str] = []
    while time.monotonic() < deadline:
        await app.poll_once()
        table = app.request_table
        column = REQUEST_COLUMNS.index("state")
        states = [str(table.get_row_at(i)[column]) for i in range(table.row_count)]
        if state in states:
            break
        await asyncio.sleep(0.25)
    return states


def test_top_shows_a_decoding_stream_then_the_server_going_away(tmp_path: Path) -> None:
    with gmlx_serve([], tmp_path) as server:
        stream = Stream(server)
        stream.start()
        assert stream.started.wait(180), "the stream produced no token"
        app = TopApp(HttpClient(server.base_url), interval=1.0, auto_poll=False)

        async def run() -> None:
            async with app.run_test(size=SIZE) as pilot:
                assert "decode" in await _wait_for_state(app, "decode", 30)
                assert app.connection == "connected" and app.model_table.selected_id() == "smollm2"
                await pilot.press("u", "y")  # /unload: not built (404), or busy while streaming (409)
                await app.workers.wait_for_complete()
                assert app.last_message.startswith("unload smollm2: "), app.last_message
                assert any(f" {code} " in app.last_message for code in (404, 409, 501)), app.last_message
                stream.stop.set()
                server.proc.terminate()
                server.proc.wait(30)
                await app.poll_once()
                assert app.connection == "disconnected"
                assert app.request_table.row_count >= 1  # the last snapshot stays on screen

        asyncio.run(run())
        stream.join(30)
