"""What keeps a web page from driving a local server: Host (DNS rebinding), Origin + CORS, Content-Type.

Runs first, before the API key: a CORS preflight carries no key, and a refused page needs no key check.
"""

from __future__ import annotations

import re
from typing import Any

import falcon.asgi

from gmlx_server.errors import HeadersTooLarge, HostNotAllowed, OriginNotAllowed, UnsupportedMediaType
from gmlx_server.routes.context import RawBody
from gmlx_server.web_policy import HostPolicy, OriginPolicy

# What the official SDKs send from a browser, so their preflights pass without listing each request.
CORS_HEADERS = ("authorization", "x-api-key", "content-type", "anthropic-version", "anthropic-beta",
                "anthropic-dangerous-direct-browser-access", "openai-organization", "openai-project",
                "openai-beta", "idempotency-key", "x-stainless-arch", "x-stainless-lang", "x-stainless-os",
                "x-stainless-package-version", "x-stainless-runtime", "x-stainless-runtime-version",
                "x-stainless-retry-count", "x-stainless-timeout", "x-stainless-async",
                "x-stainless-helper-method")
CORS_METHODS = "GET, HEAD, POST, OPTIONS"
EXPOSED_HEADERS = "Retry-After, X-Gmlx-Max-Tokens, X-Gmlx-Max-Tokens-Requested"
CORS_MAX_AGE_S = 600
BODY_METHODS = ("POST", "PUT", "PATCH")
MAX_HEAD_BYTES = 64 * 1024  # request target + headers; gmlx serve gives h11 the same bound for split heads
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")  # an HTTP header name


def media_type(content_type: str | None) -> str | None:
    """'application/json' of 'Application/JSON; charset=utf-8'; None when the header is absent or blank."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    return kind or None


def is_json(kind: str | None) -> bool:
    return kind == "application/json" or (kind is not None and kind.startswith("application/")
                                          and kind.endswith("+json"))


def head_bytes(scope: dict[str, Any]) -> int:
    target = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
    return target + sum(len(k) + len(v) + 4 for k, v in scope.get("headers", ()))  # ": " and CRLF


def _has_body(req: falcon.asgi.Request) -> bool:
    return bool(req.content_length) or req.get_header("Transfer-Encoding") is not None


class RequestGuard:
    """403 for a Host or Origin outside the allowlists, CORS for allowed origins, 415 for non-JSON bodies.

    A browser sends Origin on every cross-origin request that can change anything, so a body without
    Origin comes from curl or an SDK: there form-urlencoded (what `curl -d` sends) and a missing type
    pass; with Origin only JSON does. text/plain and multipart, the types a page posts without a
    preflight, never pass.
    """

    def __init__(self, origins: OriginPolicy, hosts: HostPolicy) -> None:
        self.origins, self.hosts = origins, hosts

    async def process_request(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        if head_bytes(req.scope) > MAX_HEAD_BYTES:  # h11 bounds only heads that arrive in pieces
            raise HeadersTooLarge(MAX_HEAD_BYTES)
        server = req.scope.get("server")
        if self.hosts.applies(str(server[0]) if server else None) and not self.hosts.allows(req.get_header("Host")):
            raise HostNotAllowed(req.get_header("Host") or "")
        origin = req.get_header("Origin")
        if origin is None:
            return
        if not self.origins.allows(origin):
            raise OriginNotAllowed(origin)
        if req.method == "OPTIONS" and req.get_header("Access-Control-Request-Method") is not None:
            self._preflight(req, resp)

    def _preflight(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        asked = (req.get_header("Access-Control-Request-Headers") or "").lower()
        extra = [h for h in (x.strip() for x in asked.split(",")) if _TOKEN.fullmatch(h) and h not in CORS_HEADERS]
        resp.status = 204
        resp.set_header("Access-Control-Allow-Methods", CORS_METHODS)
        resp.set_header("Access-Control-Allow-Headers", ", ".join((*CORS_HEADERS, *extra)))
        resp.set_header("Access-Control-Max-Age", str(CORS_MAX_AGE_S))
        if req.get_header("Access-Control-Request-Private-Network") == "true":
            resp.set_header("Access-Control-Allow-Private-Network", "true")  # Chrome's private network access
        resp.append_header("Vary", "Access-Control-Request-Method, Access-Control-Request-Headers")
        resp.complete = True  # no route, no API key: a preflight carries neither

    async def process_resource(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                               resource: object, params: dict[str, Any]) -> None:
        if resource is None or req.method not in BODY_METHODS or not _has_body(req):
            return
        kind, browser = media_type(req.content_type), req.get_header("Origin") is not None
        if is_json(kind) or (not browser and kind in (None, "application/x-www-form-urlencoded")):
            return
        if kind == "multipart/form-data" and isinstance(resource, RawBody):
            return  # an upload route (audio files); an Origin, if any, has passed the allowlist already
        raise UnsupportedMediaType(kind or "(none)", browser)

    async def process_response(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                               resource: object, req_succeeded: bool) -> None:
        resp.append_header("Vary", "Origin")  # the CORS headers depend on it, so caches must too
        origin = req.get_header("Origin")
        if origin is not None and self.origins.allows(origin):
            resp.set_header("Access-Control-Allow-Origin", origin)
            resp.set_header("Access-Control-Expose-Headers", EXPOSED_HEADERS)
