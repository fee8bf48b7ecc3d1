"""While the host drains (SIGTERM), every POST is refused with a typed 503 before its body is read.

Nothing it refuses has started, so a load balancer retries it on another host; GET routes (/health,
/v1/metrics) keep answering, so the balancer and `gmlx top` see the drain.
"""

from __future__ import annotations

import falcon.asgi

from gmlx_server.serving.drain import Drain


class DrainGate:
    def __init__(self, drain: Drain) -> None:
        self.drain = drain

    async def process_request(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        if self.drain.active and req.method == "POST":
            raise self.drain.refusal()
