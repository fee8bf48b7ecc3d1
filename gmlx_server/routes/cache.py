"""GET /v1/cache/stats and POST /v1/cache/reset: the prompt cache routes."""

from __future__ import annotations

from typing import Any

import falcon.asgi

from gmlx_server.errors import InvalidRequest
from gmlx_server.routes.common import GmlxRequest
from gmlx_server.routes.residency import _body, _model
from gmlx_server.serving.cache_stats import cache_totals, disk_dir, disk_section, resident_cache_stats
from gmlx_server.serving.model_host import ModelHost

TIERS = ("ram", "disk")  # what {"tier": ...} may name: the four RAM tiers together, or the disk tier


class CacheStats:
    """Per resident model: hits by tier, tokens reused, entries, bytes, evictions; or {"enabled": false}. With
    the disk tier on, `disk` has its directory's usage and the models' disk counters."""

    def __init__(self, host: ModelHost) -> None:
        self.host = host

    async def on_get(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        enabled = resident_cache_stats(self.host.resident)
        body: dict[str, Any] = ({"enabled": True, "models": enabled, **cache_totals(enabled)} if enabled
                                else {"enabled": False})
        disk = disk_section(self.host.config.server, enabled)
        resp.media = body | ({"disk": disk} if disk is not None else {})


class CacheReset:
    """Empties the prompt cache of every resident model, or of the one `{"model": id}` names: its RAM tiers and
    its disk files, or only one of them with `{"tier": "ram" | "disk"}`."""

    def __init__(self, host: ModelHost) -> None:
        self.host = host

    async def on_post(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        body = _body(req)
        tier = body.get("tier")
        if tier is not None and tier not in TIERS:
            raise InvalidRequest(f"'tier' must be one of {', '.join(TIERS)}, got {tier!r}", param="tier")
        if tier == "disk" and disk_dir(self.host.config.server) is None:
            raise InvalidRequest("the prompt cache's disk tier is off (server.prompt_cache_disk_bytes is 0)",
                                 param="tier")
        done = self.host.reset_cache(_model(self.host, body), ram=tier != "disk", disk=tier != "ram")
        resp.media = {"status": "ok", "reset": done.models} | (
            {"disk_entries_removed": done.disk_entries} if done.disk_entries is not None else {})
