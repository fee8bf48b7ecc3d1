"""Request plumbing shared by every route: body limit and JSON parsing, disconnect watch."""

from __future__ import annotations

import asyncio
from typing import Any

import falcon
import falcon.asgi

from gmlx_server.errors import PayloadTooLarge, RequestTimeout
from gmlx_server.protocol import jsonsafe
from gmlx_server.routes.context import RawBody, RequestContext

_OFF_LOOP_JSON_BYTES = 1 << 20


class GmlxRequest(falcon.asgi.Request):
    """Keeps the ASGI receive callable so a response can watch for the client leaving; its context is typed."""

    context_type = RequestContext
    context: RequestContext

    def __init__(self, scope: Any, receive: Any, first_event: Any = None, options: Any = None) -> None:
        super().__init__(scope, receive, first_event=first_event, options=options)
        self.asgi_receive = receive


class JsonBodyMiddleware:
    """POST bodies: size limit (413), UTF-8 and JSON checks (400), parsed into req.context.body.

    The content type is routes/guard.py's: it lets `curl -d`'s form-urlencoded through only without an
    Origin header (no page), so this middleware parses whatever body it is handed.
    """

    def __init__(self, max_bytes: int, timeout_s: float = 60.0) -> None:
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s  # the whole body, so a trickle cannot hold a request open either

    async def process_request(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        length = req.content_length
        if length is not None and length > self.max_bytes:
            raise PayloadTooLarge(self.max_bytes)

    async def process_resource(self, req: GmlxRequest, resp: falcon.asgi.Response,
                               resource: object, params: dict[str, Any]) -> None:
        req.context.body = None
        if resource is None or req.method not in ("POST", "PUT", "PATCH"):
            return
        raw = await self._read(req)
        req.context.body_bytes = len(raw)
        if isinstance(resource, RawBody):  # a multipart upload: the resource parses the bytes itself
            req.context.raw_body = raw
            return
        # A large body's checks (numpy passes, which release the GIL) run in a thread; json.loads holds it anyway.
        req.context.body = parse_json(raw) if len(raw) <= _OFF_LOOP_JSON_BYTES else await asyncio.to_thread(
            parse_json, raw)

    async def _read(self, req: falcon.asgi.Request) -> bytes:
        chunks, size = [], 0
        try:
            async with asyncio.timeout(self.timeout_s):
                async for chunk in req.stream:  # chunked bodies have no Content-Length: count as we go
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise PayloadTooLarge(self.max_bytes)
                    chunks.append(chunk)
        except TimeoutError:
            raise RequestTimeout(self.timeout_s) from None
        return b"".join(chunks)


def parse_json(raw: bytes) -> Any:
    """None for an empty body; otherwise a JSON value or a typed 400 (bad UTF-8 or JSON, NaN/Infinity,
    nesting past jsonsafe.MAX_DEPTH, a lone surrogate)."""
    if not raw.strip():
        return None
    return jsonsafe.loads(raw)


def body_of(req: GmlxRequest) -> Any:
    return req.context.body


def report_clamp(resp: falcon.asgi.Response, requested: int | None, granted: int) -> None:
    """Tell the client its max_tokens was lowered to fit the window (headers precede any stream)."""
    if requested is not None:
        resp.set_header("X-Gmlx-Max-Tokens", str(granted))
        resp.set_header("X-Gmlx-Max-Tokens-Requested", str(requested))
