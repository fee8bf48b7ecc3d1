"""GET /health: liveness, and with ?ready=1 a coarse readiness verdict. Never waits on an engine."""

from __future__ import annotations

import os

import falcon.asgi

from gmlx_server.service.host import ModelHost


class Health:
    def __init__(self, host: ModelHost) -> None:
        self.host = host

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        body: dict[str, object] = {"status": "healthy", "pid": os.getpid()}
        if not req.get_param_as_bool("ready", default=False):
            resp.media = body
            return
        r = self.host.readiness()
        body.update({"ready": r.ready, "in_flight": r.in_flight, "waiting": r.waiting})
        if not r.ready:
            body["reason"] = r.reason
            resp.status = 503
            resp.set_header("Retry-After", str(r.retry_after_s))
        resp.media = body
