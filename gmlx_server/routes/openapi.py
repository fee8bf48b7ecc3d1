"""GET /openapi.json: the OpenAPI 3.1 description of the routes (built once, by protocol.openapi)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import falcon.asgi

from gmlx_server.protocol.openapi import document


def _version() -> str:
    try:
        return version("gmlx")
    except PackageNotFoundError:  # a source tree that was never installed
        return "0"


class OpenApi:
    def __init__(self) -> None:
        self.document = document(_version())

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = self.document
