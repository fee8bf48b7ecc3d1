"""Error bodies per protocol: one shape for HTTP responses and in-stream SSE events.

How errors travel from a raise to this shape: docs/architecture.md, "Errors in one place".
"""

from __future__ import annotations

from typing import Any

from gmlx_server.errors import GmlxError

ANTHROPIC_PREFIX = "/v1/messages"


def is_anthropic(path: str) -> bool:
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


# Anthropic clients branch on these types (Claude Code retries overloaded_error), so a gmlx type
# outside the set takes the one for its status and moves to `code`.
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                    500: "api_error", 503: "overloaded_error", 529: "overloaded_error"}
# A 503 that a retry cannot cure (the model's file is broken) must not read as overloaded.
_ANTHROPIC_BY_TYPE = {"model_load_failed": "api_error"}


def _anthropic_error(err: GmlxError) -> dict[str, Any]:
    if err.type in _ANTHROPIC_TYPES.values():
        return {"type": err.type, "message": err.message, **err.extra}
    fallback = "api_error" if err.status >= 500 else "invalid_request_error"
    kind = _ANTHROPIC_BY_TYPE.get(err.type) or _ANTHROPIC_TYPES.get(err.status, fallback)
    return {"type": kind, "message": err.message, "code": err.type,
            **err.extra}


def error_body(err: GmlxError, anthropic: bool = False) -> dict[str, Any]:
    """OpenAI {"error": {message, type, param, code, ...}} or Anthropic {"type": "error", "error": {...}}."""
    if anthropic:
        return {"type": "error", "error": _anthropic_error(err)}
    return {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code,
                      **err.extra}}
