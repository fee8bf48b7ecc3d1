"""Typed errors the server raises; one mapper (routes.errors) renders them per protocol.

No falcon here: services and protocol converters raise these, routes turn them into responses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

ECHO_CHARS = 200  # how much of a client's string an error message quotes back
MAX_MESSAGE_CHARS = 2000  # a backstop for messages built from input elsewhere


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """`text`, or its first `limit` characters, an ellipsis and the full length: errors never echo megabytes."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} chars)"


class GmlxError(Exception):
    """Base: an HTTP status, a protocol error type, the offending field and extra body fields."""

    status: int = 500
    type: str = "server_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, object] | None = None,
        status: int | None = None,
        type: str | None = None,
    ) -> None:
        message = clip(message, MAX_MESSAGE_CHARS)
        super().__init__(message)
        self.message = message
        self.param = param
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type
        self.code = code if code is not None else self.type
        self.headers: dict[str, str] = dict(headers or {})
        # Extra fields rendered beside message/type (available_models, valid_profiles, ...).
        self.extra: dict[str, object] = dict(extra or {})


class InvalidRequest(GmlxError):
    status, type = 400, "invalid_request_error"


class UnsupportedFeature(GmlxError):
    """A request feature the protocols define that this build does not implement yet."""

    status, type = 400, "unsupported_feature"


class ModelNotFound(GmlxError):
    status, type = 404, "model_not_found"

    def __init__(self, model: str, available: Sequence[str]) -> None:
        names = ", ".join(available) or "none"
        super().__init__(
            f"model '{clip(model)}' not found; available models: {names}",
            param="model",
            extra={"available_models": list(available)},
        )


class UnknownProfile(GmlxError):
    status, type = 400, "unknown_profile"

    def __init__(self, profile: str, valid: Sequence[str]) -> None:
        super().__init__(
            f"unknown profile '{clip(profile)}'; valid profiles: {', '.join(valid)}",
            param="profile",
            extra={"valid_profiles": list(valid)},
        )


class ContextOverflow(GmlxError):
    """Prompt + output cap over the context window. Agent clients match the exact message prefix."""

    status, type = 400, "invalid_request_error"

    def __init__(self, prompt_tokens: int, max_tokens: int, budget: int, model: str) -> None:
        super().__init__(
            f"prompt is too long: {prompt_tokens} prompt tokens + {max_tokens} max_tokens = "
            f"{prompt_tokens + max_tokens} tokens exceeds the context window of {budget} tokens "
            f"of model '{model}'",
            param="messages",
            code="context_length_exceeded",
            extra={"prompt_tokens": prompt_tokens, "max_tokens": max_tokens, "context_budget": budget},
        )


class PayloadTooLarge(GmlxError):
    status, type = 413, "request_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body exceeds the limit of {limit} bytes (GMLX_MAX_BODY_BYTES)")


class Unauthorized(GmlxError):
    status, type = 401, "authentication_error"

    def __init__(self, message: str = "missing or invalid API key") -> None:
        super().__init__(message, code="invalid_api_key")


class InsufficientScope(GmlxError):
    """A key that may not use this route (a client key on an operator route)."""

    status, type = 403, "insufficient_scope"

    def __init__(self, name: str, route: str) -> None:
        super().__init__(f"the key '{name}' has the client scope; {route} needs a key with the admin scope",
                         code="insufficient_scope")


class HFAccessDisabled(GmlxError):
    status, type = 403, "hf_access_disabled"


def _retry(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, round(seconds)))}


class ServerOverloaded(GmlxError):
    status, type = 503, "server_overloaded"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message, headers=_retry(retry_after_s))


class RateLimited(GmlxError):
    """A caller past its fair share (server.fair_share / api_keys[].max_queued): others' work goes on."""

    status, type = 429, "rate_limited"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message, code="rate_limited", headers=_retry(retry_after_s))


class ModelLoadDeferred(GmlxError):
    status, type = 503, "model_load_deferred"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message, headers=_retry(retry_after_s))


class Shed(GmlxError):
    """The governor ended this request to free memory (finish_reason `shed`)."""

    status, type = 503, "server_overloaded_shed"

    def __init__(self, message: str = "request shed by the memory governor", retry_after_s: float = 5.0,
                 ) -> None:
        super().__init__(message, headers=_retry(retry_after_s))


class EngineFailure(GmlxError):
    """The engine ended a request with an error after it was admitted."""

    status, type = 500, "engine_error"


class EngineRestarting(GmlxError):
    """The model's engine stopped and is being restarted: retry after the backoff."""

    status, type = 503, "engine_restarting"

    def __init__(self, model_id: str, reason: str, retry_after_s: float) -> None:
        super().__init__(f"the engine of model '{model_id}' stopped ({reason}) and is restarting; "
                         f"retry after {max(1, round(retry_after_s))} s", headers=_retry(retry_after_s))


class InternalError(GmlxError):
    """An unexpected exception; the body never carries the traceback."""

    status, type = 500, "server_error"

    def __init__(self, message: str = "internal server error") -> None:
        super().__init__(message)


class OriginNotAllowed(GmlxError):
    """A browser page from an origin outside the allowlist (a cross-site request to a local server)."""

    status, type = 403, "origin_not_allowed"

    def __init__(self, origin: str) -> None:
        super().__init__(f"origin '{clip(origin)}' is not allowed; loopback origins are, and others can be "
                         f"added to server.allowed_origins in the config or GMLX_ALLOWED_ORIGINS")


class HostNotAllowed(GmlxError):
    """A Host header naming something other than this server (DNS rebinding)."""

    status, type = 403, "host_not_allowed"

    def __init__(self, host: str) -> None:
        super().__init__(f"Host '{clip(host)}' is not allowed; use localhost or an IP address, or add the "
                         f"name to server.allowed_hosts in the config or GMLX_ALLOWED_HOSTS")


class UnsupportedMediaType(GmlxError):
    status, type = 415, "unsupported_media_type"

    def __init__(self, content_type: str, browser: bool) -> None:
        why = " (a request with an Origin header)" if browser else ""
        super().__init__(f"Content-Type '{clip(content_type)}' is not accepted{why}; send application/json")


class RequestTimeout(GmlxError):
    """The client stopped sending its body; the connection is closed after the answer."""

    status, type = 408, "request_timeout"

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"request body not received within {timeout_s:g} s (GMLX_BODY_TIMEOUT_S)",
                         headers={"Connection": "close"})


class HeadersTooLarge(GmlxError):
    status, type = 431, "request_header_fields_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"request line and headers exceed {limit} bytes")
