"""GET /v1/models (and /models), GET /v1/models/{id}: configured, discovered and alias ids."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import falcon.asgi

from gmlx_server.errors import ModelNotFound
from gmlx_server.service.host import ModelHost

ServiceRows = Callable[[], list[dict[str, Any]]]  # the configured services' rows (embeddings, stt, ...)


class Models:
    def __init__(self, host: ModelHost, services: ServiceRows = list) -> None:
        self.host, self.services = host, services

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = {"object": "list", "data": await self.host.list_models() + self.services()}


class Model:
    def __init__(self, host: ModelHost, services: ServiceRows = list) -> None:
        self.host, self.services = host, services

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, model_id: str) -> None:
        rows = await self.host.list_models() + self.services()
        row = next((r for r in rows if r["id"] == model_id), None)
        if row is None:
            services = [r["id"] for r in self.services() if "alias_of" not in r]
            raise ModelNotFound(model_id, [*self.host.catalog.model_ids, *services])
        resp.media = row
