"""GET /openapi.json: the OpenAPI 3.1 description of the routes (built once, by protocol.openapi); GET and HEAD /:
what answers here, for a client or a person probing the base URL."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import falcon.asgi

from gmlx_server.protocol.openapi_doc import document


def server_version() -> str:
    try:
        return version("gmlx")
    except PackageNotFoundError:  # a source tree that was never installed
        return "0"


class OpenApi:
    def __init__(self) -> None:
        self.document = document(server_version())

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = self.document


class Root:
    """A small JSON: the name, the version and where to go next (a base-URL probe such as Claude Code's HEAD /)."""

    def __init__(self) -> None:
        self.body = {"name": "gmlx", "version": server_version(),
                     "links": {"models": "/v1/models", "docs": "/openapi.json", "health": "/health",
                               "metrics": "/v1/metrics"}}

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = self.body

    on_head = on_get  # falcon drops the body
