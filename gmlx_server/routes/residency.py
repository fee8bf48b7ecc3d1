"""POST /unload, POST /v1/keep and POST /v1/reload: the residency routes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import falcon.asgi

from gmlx_server.assistants import Assistants
from gmlx_server.config import ServerConfig
from gmlx_server.errors import InvalidRequest
from gmlx_server.protocol import params
from gmlx_server.routes.common import GmlxRequest, body_of
from gmlx_server.serving.addressing import resolve_address
from gmlx_server.serving.model_host import ModelHost
from gmlx_server.serving.reload import reload


def _body(req: GmlxRequest) -> dict[str, Any]:
    body = body_of(req)
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return body


def _model(host: ModelHost, body: dict[str, Any]) -> str | None:
    """The model id the body names (an id, alias or id@profile); None when it names none."""
    raw = body.get("model")
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str):
        raise InvalidRequest(f"'model' must be a string, got {type(raw).__name__}", param="model")
    return resolve_address(raw, None, host.catalog).model_id


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, True)
    if not isinstance(value, bool):
        raise InvalidRequest(f"'{name}' must be true or false, got {value!r}", param=name)
    return value


class Unload:
    """{"model": id} unloads that model (pinned too; 409 while it streams); no model: every idle one. An
    assistant id stops its MCP servers; its next request starts them again."""

    def __init__(self, host: ModelHost, assistants: Assistants | None = None) -> None:
        self.host, self.assistants = host, assistants

    async def on_post(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        body = _body(req)
        name = body.get("model")
        if self.assistants is not None and isinstance(name, str) and self.assistants.entry(name) is not None:
            resp.media = {"status": "ok", "unloaded": [name] if await self.assistants.unload(name) else [],
                          "busy": []}
            return
        model = _model(self.host, body)
        if model is None:
            unloaded, busy = await self.host.unload_idle()
        else:
            unloaded, busy = ([model] if await self.host.unload(model) else []), []
        resp.media = {"status": "ok", "unloaded": unloaded, "busy": busy}


class Keep:
    """{"model": id} keeps it resident past the idle timeout and warms it; "warm": false, "keep": false. A
    keep_alive (or ttl) sets its lifetime instead of keeping it: a keep has no end, so "keep": true beside one
    is a 400."""

    def __init__(self, host: ModelHost) -> None:
        self.host = host

    async def on_post(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        body = _body(req)
        model = _model(self.host, body) or resolve_address(None, None, self.host.catalog).model_id
        keep_alive = params.keep_alive(body)
        if keep_alive is not None and body.get("keep") is True:
            raise params.bad("keep", "a keep has no end: send 'keep': true or a 'keep_alive', not both")
        resp.media = await self.host.keep(model, keep=_flag(body, "keep") and keep_alive is None,
                                          warm=_flag(body, "warm"), keep_alive_s=keep_alive)


class Reload:
    def __init__(self, host: ModelHost, then: Callable[[ServerConfig], None] | None = None,
                 check: Callable[[ServerConfig], Awaitable[None]] | None = None) -> None:
        self.host, self.then = host, then  # `then` gets the new config (the services follow it)
        self.check = check  # sees the new config first and may refuse it (the assistants start their servers)

    async def on_post(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        result = await reload(self.host, self.check)
        if result.get("status") == "reloaded" and self.then is not None:
            self.then(self.host.config)
        resp.media = result
