"""Driving an EventEncoder (OpenAI chat/completions, Anthropic Messages, OpenAI Responses): SSE or one body.

One driver for every protocol: keepalive comments while silent, disconnect -> cancel, and a
failure after the stream started becomes the encoder's own error events.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

import falcon.asgi

from gmlx_server.engine.types import RequestHandle
from gmlx_server.protocol.openai_out import event_error
from gmlx_server.protocol.shared import Event, EventEncoder
from gmlx_server.routes.common import GmlxRequest
from gmlx_server.routes.error_mapper import as_gmlx_error
from gmlx_server.routes.streaming import KEEPALIVE, SSE_HEADERS, ClientDisconnected, Receive, watch_events

OnDone = Callable[[], None]
Progress = Callable[[], tuple[int, int] | None]  # (prompt tokens prefilled, prompt tokens) while prefilling


def keepalive(progress: Progress | None) -> bytes:
    """The silence-breaking comment; while the request prefills it says how far (`: keepalive prefill 2048/18700`),
    for a client that shows comments or a person running curl."""
    done = progress() if progress is not None else None
    return KEEPALIVE if done is None else f": keepalive prefill {done[0]}/{done[1]}\n\n".encode()


def frame(event: Event) -> bytes:
    """`event: NAME` (omitted for OpenAI's unnamed events) and `data: JSON` (or raw text such as [DONE])."""
    name, payload = event
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {data}\n\n".encode()


async def event_stream(handle: RequestHandle, encoder: EventEncoder, receive: Receive, keepalive_s: float,
                       on_done: OnDone | None = None, progress: Progress | None = None) -> AsyncIterator[bytes]:
    """The encoder's events as SSE; `on_done` runs once the request ended without an error."""
    for event in encoder.start():
        yield frame(event)
    try:
        async with aclosing(watch_events(handle, receive, keepalive_s)) as events:
            async for ev in events:
                if ev is None:
                    yield keepalive(progress)
                    continue
                for event in encoder.feed(ev):
                    yield frame(event)
                err = event_error(ev)
                if err is not None:
                    for event in encoder.fail(err):
                        yield frame(event)
                    return
        if on_done is not None:
            on_done()
    except ClientDisconnected:
        return
    except Exception as exc:
        for event in encoder.fail(as_gmlx_error(exc, "while streaming")):
            yield frame(event)


async def collect_body(handle: RequestHandle, encoder: EventEncoder, receive: Receive) -> dict[str, Any]:
    """The whole non-streamed body; raises the typed error if the request ends in one."""
    async with aclosing(watch_events(handle, receive, None)) as events:
        async for ev in events:
            if ev is None:
                continue
            encoder.feed(ev)
            err = event_error(ev)
            if err is not None:
                raise err
    return encoder.body()


async def send(req: GmlxRequest, resp: falcon.asgi.Response, handle: RequestHandle, encoder: EventEncoder,
               stream: bool, keepalive_s: float, on_done: OnDone | None = None,
               progress: Progress | None = None) -> None:
    if stream:
        resp.content_type = "text/event-stream"
        resp.set_headers(SSE_HEADERS)
        resp.stream = event_stream(handle, encoder, req.asgi_receive, keepalive_s, on_done, progress)
        return
    resp.media = await collect_body(handle, encoder, req.asgi_receive)
    if on_done is not None:
        on_done()
