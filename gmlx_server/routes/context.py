"""What the middlewares learn of a request, typed: Falcon builds one per request (GmlxRequest.context_type)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import falcon

if TYPE_CHECKING:
    from gmlx_server.serving.fair_share import Caller
    from gmlx_server.serving.request_log import RequestRecord


class RequestContext(falcon.Context):
    body: Any = None  # the parsed JSON body (JsonBodyMiddleware); None for none or a raw-body route
    body_bytes: int = 0  # the body's size as read
    raw_body: bytes = b""  # a RawBody route's bytes, unparsed
    key_ok: bool = False  # a valid key was sent, or none is configured (AuthMiddleware)
    caller: Caller | None = None  # who sent it (AuthMiddleware); None when an earlier middleware refused it
    request_record: RequestRecord | None = None  # the request log's line (generation routes only)


class RawBody:
    """A resource that parses its body itself (a multipart upload): the body middleware hands over the bytes."""
