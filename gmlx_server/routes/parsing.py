"""Protocol converters on a request body, off the event loop when the body is large.

A converter walks every message and content part in Python: 0.45 s for 300k Anthropic messages. In a
worker thread the GIL changes hands every 5 ms, so /health keeps answering while it runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from gmlx_server.routes.common import GmlxRequest, body_of

T = TypeVar("T")
OFF_LOOP_BODY_BYTES = 64 << 10  # a smaller body converts in well under a millisecond


async def parse_body(req: GmlxRequest, parse: Callable[[Any], T]) -> T:
    length = req.content_length
    if length is not None and length <= OFF_LOOP_BODY_BYTES:
        return parse(body_of(req))
    return await asyncio.to_thread(parse, body_of(req))  # large, or chunked (length unknown)
