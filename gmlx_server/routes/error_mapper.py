"""The one error mapper: GmlxError, falcon.HTTPError and anything unexpected -> the protocol's body."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import falcon
import falcon.asgi

from gmlx_server.errors import GmlxError, InternalError
from gmlx_server.protocol.error_bodies import error_body, is_anthropic
from gmlx_server.routes.common import GmlxRequest
from gmlx_server.routes.request_log import request_record

log = logging.getLogger("gmlx.server")

# falcon's own errors (unknown route, bad method, ...) get the type a client of each status expects.
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "method_not_allowed", 413: "request_too_large",
          415: "invalid_request_error", 429: "rate_limit_error"}


def as_gmlx_error(ex: BaseException, where: str = "") -> GmlxError:
    """Typed errors pass through; falcon's keep their status; the rest become a 500 (logged)."""
    if isinstance(ex, GmlxError):
        return ex
    if isinstance(ex, falcon.HTTPError):
        status = ex.status_code
        message = ex.description or ex.title or "error"
        raw = ex.headers or {}
        pairs = raw.items() if isinstance(raw, Mapping) else raw
        headers = {k: v for k, v in pairs if k.lower() in ("allow", "retry-after")}
        return GmlxError(message, status=status, type=_TYPES.get(status, "server_error" if status >= 500
                                                                   else "invalid_request_error"),
                         headers=headers)
    log.error("unexpected error %s", where, exc_info=ex)
    return InternalError()


async def handle_error(req: GmlxRequest, resp: falcon.asgi.Response | None, ex: Exception,
                       params: dict[str, Any], ws: object = None) -> None:
    if resp is None:  # a WebSocket; none are served
        return
    err = as_gmlx_error(ex, f"in {req.method} {req.path}")
    record = request_record(req)
    if record is not None:
        record.refused(err)
    if isinstance(ex, falcon.HTTPError) and not ex.description:
        err.message = f"{req.method} {req.path}: {ex.title}"  # e.g. "GET /v1/nope: 404 Not Found"
    resp.status = err.status
    for k, v in err.headers.items():
        resp.set_header(k, v)
    resp.content_type = falcon.MEDIA_JSON
    resp.data = render(error_body(err, anthropic=is_anthropic(req.path)))


def render(body: dict[str, Any]) -> bytes:
    """JSON that cannot fail to encode: a lone surrogate in a message (an echoed model name) is written
    as its \\uXXXX escape, a value JSON cannot hold as its str()."""
    return json.dumps(body, ensure_ascii=False, default=str).encode("utf-8", "backslashreplace")
