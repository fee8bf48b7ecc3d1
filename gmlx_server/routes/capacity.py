"""POST /v1/estimate and GET /v1/capacity/plan: what a dispatcher reads before sending work."""

from __future__ import annotations

import falcon
import falcon.asgi

from gmlx_server.errors import InvalidRequest
from gmlx_server.protocol.openai import parse_chat
from gmlx_server.routes.common import GmlxRequest
from gmlx_server.routes.parsing import parse_body
from gmlx_server.service.estimate import Estimator


class Estimate:
    def __init__(self, estimator: Estimator) -> None:
        self.estimator = estimator

    async def on_post(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        resp.media = await self.estimator.estimate(await parse_body(req, parse_chat))


def _positive_int(req: falcon.asgi.Request, name: str) -> int:
    raw = req.get_param(name)
    try:
        value = int(raw) if raw is not None else 0
    except ValueError:
        value = 0
    if value < 1:
        raise InvalidRequest(f"{name} must be a positive integer, got {raw!r}", param=name)
    return value


class CapacityPlan:
    def __init__(self, estimator: Estimator) -> None:
        self.estimator = estimator

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = self.estimator.plan(_positive_int(req, "width"), _positive_int(req, "depth"))
