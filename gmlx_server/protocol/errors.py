"""Error bodies per protocol (DESIGN §5): one shape for HTTP responses and in-stream SSE events."""

from __future__ import annotations

import json
from typing import Any

from gmlx_server.errors import GmlxError

ANTHROPIC_PREFIX = "/v1/messages"


def is_anthropic(path: str) -> bool:
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


def error_body(err: GmlxError, anthropic: bool = False) -> dict[str, Any]:
    """OpenAI {"error": {message, type, param, code, ...}} or Anthropic {"type": "error", "error": {...}}."""
    if anthropic:
        return {"type": "error", "error": {"type": err.type, "message": err.message, **err.extra}}
    return {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code,
                      **err.extra}}


def sse_error_event(err: GmlxError, anthropic: bool = False) -> bytes:
    """The final SSE event of a stream that failed after it started."""
    data = json.dumps(error_body(err, anthropic), ensure_ascii=False)
    return (f"event: error\ndata: {data}\n\n" if anthropic else f"data: {data}\n\n").encode()
