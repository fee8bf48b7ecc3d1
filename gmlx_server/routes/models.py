"""GET /v1/models (and /models), GET /v1/models/{id}: configured, discovered and alias ids."""

from __future__ import annotations

import falcon.asgi

from gmlx_server.errors import ModelNotFound
from gmlx_server.service.host import ModelHost


class Models:
    def __init__(self, host: ModelHost) -> None:
        self.host = host

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = {"object": "list", "data": await self.host.list_models()}


class Model:
    def __init__(self, host: ModelHost) -> None:
        self.host = host

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, model_id: str) -> None:
        rows = await self.host.list_models()
        row = next((r for r in rows if r["id"] == model_id), None)
        if row is None:
            raise ModelNotFound(model_id, self.host.catalog.model_ids)
        resp.media = row
