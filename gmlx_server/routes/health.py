"""GET/HEAD /health: liveness, and with ?ready=1 a coarse readiness verdict. Never waits on an engine.

With an API key configured, a probe without the key sees only status, ready and reason: the PID and
the queue figures are for key holders (and for everyone on a key-less server).
"""

from __future__ import annotations

import os

import falcon.asgi

from gmlx_server.serving.model_host import ModelHost


class Health:
    def __init__(self, host: ModelHost, key_required: bool = False) -> None:
        self.host = host
        self.key_required = key_required

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        full = not self.key_required or req.context.key_ok
        body: dict[str, object] = {"status": "healthy"}
        if full:
            body["pid"] = os.getpid()
        if req.get_param_as_bool("ready", default=False):
            r = self.host.readiness()
            body["ready"] = r.ready
            if full:
                body.update({"in_flight": r.in_flight, "waiting": r.waiting})
            if not r.ready:
                body["reason"] = r.reason
                resp.status = 503
                resp.set_header("Retry-After", str(r.retry_after_s))
        resp.media = body

    on_head = on_get  # load balancers and uptime probes often send HEAD; falcon drops the body
