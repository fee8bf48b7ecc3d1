"""GET /v1/metrics (and /metrics): the JSON snapshot, or Prometheus text with ?format=prometheus."""

from __future__ import annotations

import falcon
import falcon.asgi
from prometheus_client import CollectorRegistry

from gmlx_server.serving.prometheus import CONTENT_TYPE, render
from gmlx_server.serving.snapshot import Snapshotter


class Metrics:
    def __init__(self, snapshots: Snapshotter, registry: CollectorRegistry) -> None:
        self.snapshots, self.registry = snapshots, registry

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        fmt = req.get_param("format", default="json")
        if fmt == "prometheus":
            resp.content_type = CONTENT_TYPE
            resp.data = render(self.registry)
        elif fmt == "json":
            resp.media = self.snapshots.snapshot()
        else:
            raise falcon.HTTPBadRequest(title="invalid_request_error",
                                        description=f"format must be json or prometheus, not {fmt!r}")
