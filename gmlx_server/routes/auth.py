"""Who is calling: the API key (any of the configured ones, compared in constant time), its scope on the operator
routes, the caller every later step sees (`req.context.caller`), and the audit line of every operator action.

No key is ever logged or shown; its name is. On a key-less server every caller is its client address with the
admin scope, as before keys had scopes.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import falcon.asgi

from gmlx_server.config import ApiKey, FairShare
from gmlx_server.errors import InsufficientScope, Unauthorized
from gmlx_server.log_format import FIELDS, kv_text
from gmlx_server.routes.common import GmlxRequest
from gmlx_server.routes.request_log import request_record
from gmlx_server.serving.fair_share import Caller
from gmlx_server.serving.telemetry import Telemetry

PUBLIC_PATHS = frozenset({"/health"})  # the only route that never needs a key
audit = logging.getLogger("gmlx.audit")


class AuthMiddleware:
    """Every route but /health needs a key when keys are configured (`Authorization: Bearer` or `x-api-key`);
    a client-scope key on an operator route is a 403 `insufficient_scope`."""

    def __init__(self, keys: Sequence[ApiKey], admin_paths: Iterable[str], default_share: FairShare,
                 telemetry: Telemetry) -> None:
        self._keys = [(k, k.key.encode()) for k in keys]
        self._admin = frozenset(admin_paths)
        self._share, self._telemetry = default_share, telemetry

    def _match(self, candidate: str | None) -> ApiKey | None:
        """The key `candidate` is, comparing against every key so the time says nothing of which matched."""
        found = None
        raw = (candidate or "").encode()
        for key, secret in self._keys:
            if hmac.compare_digest(raw, secret) and candidate is not None:
                found = key
        return found

    def _presented(self, req: GmlxRequest) -> ApiKey | None:
        scheme, _, token = (req.get_header("Authorization") or "").partition(" ")
        bearer = token.strip() if scheme.lower() == "bearer" else None
        return self._match(bearer) or self._match(req.get_header("x-api-key"))

    async def process_request(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        address = req.remote_addr or "-"
        key = self._presented(req) if self._keys else None
        req.context.key_ok = key is not None or not self._keys
        if key is None:
            caller = Caller(None, address, "admin" if not self._keys else "client", self._share)
        else:
            caller = Caller(key.name, address, key.scope, key.share or self._share)
        req.context.caller = caller
        record = request_record(req)
        if record is not None:
            record.caller = caller
        if not req.context.key_ok and req.path not in PUBLIC_PATHS:  # /health shows less without one
            raise Unauthorized()
        if req.path in self._admin and caller.scope != "admin" and req.method != "OPTIONS":
            raise InsufficientScope(caller.label, req.path)

    async def process_response(self, req: GmlxRequest, resp: falcon.asgi.Response, resource: Any,
                               req_succeeded: bool) -> None:
        caller = req.context.caller  # None: an earlier middleware refused the request
        if caller is None or req.path in PUBLIC_PATHS:
            return
        status = resp.status_code
        self._telemetry.keys.request(caller.label, status)
        if req.path in self._admin and req.method != "OPTIONS":
            self._audit(req, caller, status)

    @staticmethod
    def _audit(req: GmlxRequest, caller: Caller, status: int) -> None:
        body = req.context.body
        target = body.get("model") if isinstance(body, dict) else None
        fields: dict[str, Any] = {
            "key": caller.key, "client": caller.address, "action": f"{req.method} {req.path}",
            "target": target if isinstance(target, str) else None, "status": status,
            "outcome": "ok" if status < 400 else "refused" if status < 500 else "failed",
        }
        audit.info("audit %s", kv_text(fields), extra={FIELDS: {"event": "audit", **fields}})
