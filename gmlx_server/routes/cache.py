"""GET /v1/cache/stats and POST /v1/cache/reset: the prompt cache routes (spec: Endpoints)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import falcon.asgi

from gmlx_server.routes.common import GmlxRequest
from gmlx_server.routes.residency import _body, _model
from gmlx_server.service.host import ModelHost


def _stats(engine: object) -> dict[str, Any]:
    fn = getattr(engine, "cache_stats", None)  # engines without a prompt cache (fakes, services) lack it
    return dict(fn()) if callable(fn) else {"enabled": False}


class CacheStats:
    """Per resident model: hits by tier, tokens reused, entries, bytes, evictions; or {"enabled": false}."""

    def __init__(self, host: ModelHost) -> None:
        self.host = host

    async def on_get(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        models = {m: _stats(e) for m, e in self.host.resident.items()}
        enabled = {m: s for m, s in models.items() if s.get("enabled")}
        resp.media = {"enabled": True, "models": enabled, **_totals(enabled)} if enabled else {"enabled": False}


def _totals(models: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    keys = ("bytes", "entries", "tokens_reused", "evictions", "misses")
    hits: dict[str, int] = {}
    for s in models.values():
        for tier, n in s.get("hits", {}).items():
            hits[tier] = hits.get(tier, 0) + n
    return {**{k: sum(int(s.get(k, 0)) for s in models.values()) for k in keys}, "hits": hits}


class CacheReset:
    """Empties the prompt cache of every resident model, or of the one `{"model": id}` names."""

    def __init__(self, host: ModelHost) -> None:
        self.host = host

    async def on_post(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        model = _model(self.host, _body(req))
        engines = {m: e for m, e in self.host.resident.items() if model is None or m == model}
        done = []
        for m, e in engines.items():
            fn = getattr(e, "reset_cache", None)
            if callable(fn):
                fn()
                done.append(m)
        resp.media = {"status": "ok", "reset": done}
