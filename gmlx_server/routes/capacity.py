"""POST /v1/estimate and GET /v1/capacity/plan: what a dispatcher reads before sending work."""

from __future__ import annotations

from collections.abc import Callable

import falcon
import falcon.asgi

from gmlx_server.config import ServerSettings
from gmlx_server.errors import InvalidRequest
from gmlx_server.protocol.openai import parse_chat
from gmlx_server.routes.common import GmlxRequest
from gmlx_server.routes.parsing import parse_body
from gmlx_server.serving.estimate import Estimator
from gmlx_server.serving.fair_share import key_split, with_key


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
    def __init__(self, estimator: Estimator, keys: Callable[[], ServerSettings]) -> None:
        self.estimator, self.keys = estimator, keys

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        width, depth, key = _positive_int(req, "width"), _positive_int(req, "depth"), req.get_param("key")
        if key is None:
            resp.media = self.estimator.plan(width, depth)
            return
        share = key_split(self.keys(), key, width)  # the key's fan-out runs only as wide as its share
        resp.media = with_key(self.estimator.plan(max(share.runs, 1), depth), share, width)
