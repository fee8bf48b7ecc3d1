"""Request plumbing shared by every route: API key, body limit and JSON parsing, disconnect watch."""

from __future__ import annotations

import hmac
import json
from typing import Any

import falcon
import falcon.asgi

from gmlx_server.errors import InvalidRequest, PayloadTooLarge, Unauthorized

PUBLIC_PATHS = frozenset({"/health"})  # the only route that never needs the API key


class GmlxRequest(falcon.asgi.Request):
    """Keeps the ASGI receive callable so a response can watch for the client leaving."""

    def __init__(self, scope: Any, receive: Any, first_event: Any = None, options: Any = None) -> None:
        super().__init__(scope, receive, first_event=first_event, options=options)
        self.asgi_receive = receive


class ApiKeyMiddleware:
    """Every route but /health needs the key, as `Authorization: Bearer` or `x-api-key`."""

    def __init__(self, api_key: str) -> None:
        self._key = api_key.encode()

    def _matches(self, candidate: str | None) -> bool:
        return candidate is not None and hmac.compare_digest(candidate.encode(), self._key)

    async def process_request(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        if req.path in PUBLIC_PATHS:
            return
        auth = req.get_header("Authorization") or ""
        scheme, _, token = auth.partition(" ")
        bearer = token.strip() if scheme.lower() == "bearer" else None
        if not (self._matches(bearer) or self._matches(req.get_header("x-api-key"))):
            raise Unauthorized()


class JsonBodyMiddleware:
    """POST bodies: size limit (413), UTF-8 and JSON checks (400), parsed into req.context.body.

    The content type is not checked: `curl -d` sends JSON as form-urlencoded, and the spec's
    own examples do exactly that.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes

    async def process_request(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        length = req.content_length
        if length is not None and length > self.max_bytes:
            raise PayloadTooLarge(self.max_bytes)

    async def process_resource(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                               resource: object, params: dict[str, Any]) -> None:
        req.context.body = None
        if resource is None or req.method not in ("POST", "PUT", "PATCH"):
            return
        req.context.body = parse_json(await self._read(req))

    async def _read(self, req: falcon.asgi.Request) -> bytes:
        chunks, size = [], 0
        async for chunk in req.stream:  # chunked bodies have no Content-Length: count as we go
            size += len(chunk)
            if size > self.max_bytes:
                raise PayloadTooLarge(self.max_bytes)
            chunks.append(chunk)
        return b"".join(chunks)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(raw: bytes) -> Any:
    """None for an empty body; otherwise a JSON value (NaN/Infinity rejected) or a typed 400."""
    if not raw.strip():
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidRequest(f"request body is not valid UTF-8 (byte {e.start})") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError as e:
        raise InvalidRequest(f"request body is not valid JSON: {e}") from None


def body_of(req: falcon.asgi.Request) -> Any:
    return getattr(req.context, "body", None)


def report_clamp(resp: falcon.asgi.Response, requested: int | None, granted: int) -> None:
    """Tell the client its max_tokens was lowered to fit the window (headers precede any stream)."""
    if requested is not None:
        resp.set_header("X-Gmlx-Max-Tokens", str(granted))
        resp.set_header("X-Gmlx-Max-Tokens-Requested", str(requested))
