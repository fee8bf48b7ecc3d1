"""uvicorn's h11 protocol with a deadline on each request's head (request line + headers).

uvicorn times out only idle keep-alive connections, so a client that connects and never finishes its
headers (a slowloris) holds a socket forever. This closes such a connection after `header_timeout_s`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from gmlx_server.routes.guard import MAX_HEAD_BYTES

log = logging.getLogger("gmlx.serve")


class HeaderTimeoutProtocol(H11Protocol):
    header_timeout_s = 20.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the head is in: the body has its own timeout
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._arm()  # the next request on a kept-alive connection gets the same deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expire(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            log.info("closing a connection from %s: no complete request head within %g s", self.client,
                     self.header_timeout_s)
            self.transport.close()


def with_header_timeout(timeout_s: float) -> type[HeaderTimeoutProtocol]:
    """The protocol class for uvicorn's `http=` setting, with this deadline."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout_s": timeout_s})


def uvicorn_limits(header_timeout_s: float) -> dict[str, Any]:
    """uvicorn settings for `gmlx serve` and the gunicorn worker: the head deadline, and h11 bounding a head
    that arrives in pieces as the app bounds one that arrives whole."""
    return {"http": with_header_timeout(header_timeout_s), "h11_max_incomplete_event_size": MAX_HEAD_BYTES}
