"""GET /v1/models (and /models), GET /v1/models/{id}: configured, discovered and alias ids."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import falcon.asgi

from gmlx_server.errors import ModelNotFound
from gmlx_server.serving.model_host import ModelHost

ServiceRows = Callable[[], list[dict[str, Any]]]  # the configured services' rows (embeddings, stt, ...)
AssistantRows = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]  # from the model rows: the assistants'


def _no_assistants(model_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return []


async def _rows(host: ModelHost, services: ServiceRows, assistants: AssistantRows) -> list[dict[str, Any]]:
    rows = await host.list_models()
    return rows + services() + assistants(rows)


class Models:
    def __init__(self, host: ModelHost, services: ServiceRows = list, assistants: AssistantRows = _no_assistants,
                 ) -> None:
        self.host, self.services, self.assistants = host, services, assistants

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = {"object": "list", "data": await _rows(self.host, self.services, self.assistants)}


class Model:
    def __init__(self, host: ModelHost, services: ServiceRows = list, assistants: AssistantRows = _no_assistants,
                 ) -> None:
        self.host, self.services, self.assistants = host, services, assistants

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, model_id: str) -> None:
        rows = await _rows(self.host, self.services, self.assistants)
        row = next((r for r in rows if r["id"] == model_id), None)
        if row is None:
            others = [r["id"] for r in rows if r.get("kind") != "chat" and "alias_of" not in r]
            raise ModelNotFound(model_id, [*self.host.catalog.model_ids, *others])
        resp.media = row
