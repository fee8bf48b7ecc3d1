"""The request log's lifecycle: a record per generation request from its arrival, its line written when the
response is complete (a stream's last byte, or a refusal's body), with the status it was answered with."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import falcon.asgi

from gmlx_server.routes.common import GmlxRequest
from gmlx_server.service.request_log import RequestRecord

GENERATION_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"})


def request_record(req: GmlxRequest) -> RequestRecord | None:
    """The record the route hands to the service (None outside the generation routes)."""
    return req.context.request_record


def _error_type(resp: falcon.asgi.Response) -> str | None:
    """The error body's type (OpenAI and Anthropic both nest it under "error")."""
    try:
        body = json.loads(resp.data or b"null")
    except ValueError:
        return None
    err = body.get("error") if isinstance(body, dict) else None
    return str(err.get("type")) if isinstance(err, dict) and err.get("type") else None


async def _logged(stream: AsyncIterable[bytes], record: RequestRecord, status: int) -> AsyncIterator[bytes]:
    try:
        async for chunk in stream:
            yield chunk
    finally:  # also when the client left and the stream was closed early
        record.emit(status)


class RequestLogMiddleware:
    """First in the chain, so a request refused by any other middleware is logged too."""

    async def process_request(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        if req.method == "POST" and req.path in GENERATION_ROUTES:
            req.context.request_record = RequestRecord(req.path)

    async def process_response(self, req: GmlxRequest, resp: falcon.asgi.Response, resource: Any,
                               req_succeeded: bool) -> None:
        record = request_record(req)
        if record is None:
            return
        status = resp.status_code
        if resp.stream is not None:
            resp.stream = _logged(resp.stream, record, status)
        else:
            record.emit(status, _error_type(resp) if status >= 400 else None)
