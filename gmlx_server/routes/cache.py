"""GET /v1/cache/stats and POST /v1/cache/reset: the prompt cache routes."""

from __future__ import annotations

import falcon.asgi

from gmlx_server.routes.common import GmlxRequest
from gmlx_server.routes.residency import _body, _model
from gmlx_server.serving.cache_stats import cache_totals, resident_cache_stats
from gmlx_server.serving.model_host import ModelHost


class CacheStats:
    """Per resident model: hits by tier, tokens reused, entries, bytes, evictions; or {"enabled": false}."""

    def __init__(self, host: ModelHost) -> None:
        self.host = host

    async def on_get(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        enabled = resident_cache_stats(self.host.resident)
        resp.media = {"enabled": True, "models": enabled, **cache_totals(enabled)} if enabled else {"enabled": False}


class CacheReset:
    """Empties the prompt cache of every resident model, or of the one `{"model": id}` names."""

    def __init__(self, host: ModelHost) -> None:
        self.host = host

    async def on_post(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        resp.media = {"status": "ok", "reset": self.host.reset_cache(_model(self.host, _body(req)))}
