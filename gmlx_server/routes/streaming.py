"""Iterating a request's events on behalf of a client: keepalive ticks, disconnect -> cancel.

Falcon does not tell a `resp.stream` generator that the client left (uvicorn's send() turns
into a no-op), so we watch the ASGI receive channel for http.disconnect ourselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from gmlx_server.engine.types import RequestHandle, TokenEvent
from gmlx_server.errors import GmlxError

Receive = Callable[[], Awaitable[dict[str, Any]]]
KEEPALIVE = b": keepalive\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


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
