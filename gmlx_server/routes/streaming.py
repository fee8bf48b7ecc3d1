"""Iterating a request's events on behalf of a client: keepalive ticks, disconnect -> cancel, SSE.

Falcon does not tell a `resp.stream` generator that the client left (uvicorn's send() turns
into a no-op), so we watch the ASGI receive channel for http.disconnect ourselves.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

from gmlx_server.engine.types import RequestHandle, TokenEvent
from gmlx_server.errors import GmlxError
from gmlx_server.protocol.errors import sse_error_event
from gmlx_server.protocol.openai_out import OpenAIEncoder, event_error
from gmlx_server.routes.errors import as_gmlx_error

Receive = Callable[[], Awaitable[dict[str, Any]]]
DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keepalive\n\n"


class ClientDisconnected(GmlxError):
    """The client closed the connection and the request was cancelled (nginx's 499: nobody reads it)."""

    status, type = 499, "client_closed_request"

    def __init__(self) -> None:
        super().__init__("the client closed the connection")


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def watch_events(handle: RequestHandle, receive: Receive,
                       keepalive_s: float | None) -> AsyncGenerator[TokenEvent | None, None]:
    """The handle's events; None after `keepalive_s` of silence. Raises ClientDisconnected if the client
    leaves; cancels the request whenever iteration stops before its final event."""
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    events = handle.__aiter__()
    pending: asyncio.Future[TokenEvent] | None = None
    finished = False
    try:
        while not finished:
            if pending is None:
                pending = asyncio.ensure_future(events.__anext__())
            done, _ = await asyncio.wait((pending, watcher), timeout=keepalive_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            if watcher in done:
                raise ClientDisconnected()
            if pending not in done:
                yield None
                continue
            try:
                ev = pending.result()
            except StopAsyncIteration:
                finished = True
                break
            pending = None
            finished = ev.finish_reason is not None
            yield ev
    finally:
        watcher.cancel()
        if pending is not None and not pending.done():
            pending.cancel()
        if not finished:
            handle.cancel()


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


async def openai_sse(handle: RequestHandle, encoder: OpenAIEncoder, receive: Receive,
                     keepalive_s: float) -> AsyncIterator[bytes]:
    """data: chunks, keepalive comments while silent, the usage chunk if asked, then data: [DONE].
    A failure after the stream started becomes a final error event from the same mapper."""
    first = encoder.start()
    if first is not None:
        yield sse(first)
    try:
        async with aclosing(watch_events(handle, receive, keepalive_s)) as events:
            async for ev in events:
                if ev is None:
                    yield KEEPALIVE
                    continue
                for chunk in encoder.feed(ev):
                    yield sse(chunk)
                err = event_error(ev)
                if err is not None:
                    yield sse_error_event(err)
                    yield DONE
                    return
        if encoder.meta.include_usage:
            yield sse(encoder.usage_chunk())
        yield DONE
    except ClientDisconnected:
        return
    except Exception as exc:
        yield sse_error_event(as_gmlx_error(exc, "while streaming"))
        yield DONE


async def collect(handle: RequestHandle, encoder: OpenAIEncoder, receive: Receive) -> dict[str, Any]:
    """The whole non-streamed body; raises the typed error if the request ends in one."""
    async with aclosing(watch_events(handle, receive, None)) as events:
        async for ev in events:
            if ev is None:
                continue
            encoder.feed(ev)
            err = event_error(ev)
            if err is not None:
                raise err
    return encoder.response()
