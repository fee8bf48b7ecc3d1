"""The request log's lifecycle: a record per generation request from its arrival, its line written when the
response is complete (a stream's last byte, or a refusal's body), with the status it was answered with.
The body's ignored fields go to the once-an-hour warning (serving/ignored_fields.py) and onto the line."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import falcon.asgi

from gmlx_server.protocol.params import Route, ignored_fields
from gmlx_server.routes.common import GmlxRequest, body_of
from gmlx_server.serving.ignored_fields import IgnoredFields
from gmlx_server.serving.request_log import RequestRecord

ROUTE_OF: dict[str, Route] = {"/v1/chat/completions": "chat", "/v1/completions": "completions",
                              "/v1/messages": "messages", "/v1/responses": "responses"}
GENERATION_ROUTES = frozenset(ROUTE_OF)


def request_record(req: GmlxRequest) -> RequestRecord | None:
    """The record the route hands to the service (None outside the generation routes)."""
    return req.context.request_record


async def _logged(stream: AsyncIterable[bytes], record: RequestRecord, status: int) -> AsyncIterator[bytes]:
    try:
        async for chunk in stream:
            yield chunk
    finally:  # also when the client left and the stream was closed early
        record.emit(status)


class RequestLogMiddleware:
    """First in the chain, so a request refused by any other middleware is logged too."""

    def __init__(self, ignored: IgnoredFields) -> None:
        self.ignored = ignored

    async def process_request(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        if req.method == "POST" and req.path in GENERATION_ROUTES:
            req.context.request_record = RequestRecord(req.path)

    async def process_response(self, req: GmlxRequest, resp: falcon.asgi.Response, resource: Any,
                               req_succeeded: bool) -> None:
        record = request_record(req)
        if record is None:
            return
        body = body_of(req)
        if isinstance(body, dict):
            record.ignored = ignored_fields(ROUTE_OF[req.path], body)
            self.ignored.note(f"{req.remote_addr} {req.user_agent or '-'}", req.path, record.ignored)
        status = resp.status_code
        if resp.stream is not None:
            resp.stream = _logged(resp.stream, record, status)
        else:
            record.emit(status)
