"""The HTTP side of `gmlx top`: poll /v1/metrics and call the residency and cache routes.

No Textual import here: the app depends on the TopClient protocol, so tests drive it with a fake.
A transport failure (server down, restarting) raises httpx.TransportError from fetch(); a non-2xx
answer raises ApiError with the server's typed error. Actions never raise: they return an
ActionResult that the app shows, so a route the server has not built (404/501) is just a message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

import httpx

ActionKind = Literal["unload", "keep", "release", "reset"]
# kind -> (path, extra body fields); the model id is added to every body.
ACTIONS: dict[ActionKind, tuple[str, dict[str, Any]]] = {
    "unload": ("/unload", {}),
    "keep": ("/v1/keep", {}),
    "release": ("/v1/keep", {"keep": False}),
    "reset": ("/v1/cache/reset", {}),
}
DEFAULT_URL = "http://127.0.0.1:8080"


class ApiError(Exception):
    """A non-2xx answer, with the fields of the server's typed error body when it has one."""

    def __init__(self, status: int, type_: str, message: str) -> None:
        super().__init__(f"{status} {type_}: {message}")
        self.status, self.type, self.message = status, type_, message


@dataclass(frozen=True)
class ActionResult:
    ok: bool
    status: int  # 0 when the server could not be reached
    message: str


class TopClient(Protocol):
    base_url: str

    async def fetch(self) -> dict[str, Any]: ...

    async def action(self, kind: ActionKind, model: str) -> ActionResult: ...

    async def aclose(self) -> None: ...


def normalize_url(url: str | None) -> str:
    """`localhost:8080`, `http://h:1/`, `http://h:1/v1` -> `http://h:1` (the server root)."""
    url = (url or DEFAULT_URL).strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url.removesuffix("/v1")


def api_error(response: httpx.Response) -> ApiError:
    """The server's {"error": {"type", "message"}} body, or the status line for anything else."""
    try:
        err = response.json().get("error")
    except ValueError:
        err = None
    if isinstance(err, dict):
        return ApiError(response.status_code, str(err.get("type") or "error"), str(err.get("message") or ""))
    text = response.text.strip()[:200] or response.reason_phrase
    return ApiError(response.status_code, "http_error", text)


def describe(kind: ActionKind, model: str, response: httpx.Response) -> ActionResult:
    if response.is_success:
        return ActionResult(True, response.status_code, f"{kind} {model}: done ({response.status_code})")
    err = api_error(response)
    hint = " (this server has no such route)" if err.status in (404, 501) else ""
    return ActionResult(False, err.status, f"{kind} {model}: {err.status} {err.type}: {err.message}{hint}")


class HttpClient:
    """TopClient over httpx against a real server."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None, timeout_s: float = 5.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = normalize_url(base_url)
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout_s,
                                       transport=transport)

    async def fetch(self) -> dict[str, Any]:
        response = await self._http.get("/v1/metrics")
        if not response.is_success:
            raise api_error(response)
        body = response.json()
        if not isinstance(body, dict) or not isinstance(body.get("server"), dict):
            raise ApiError(response.status_code, "bad_snapshot", "/v1/metrics has no server object")
        return body

    async def action(self, kind: ActionKind, model: str) -> ActionResult:
        path, extra = ACTIONS[kind]
        try:
            response = await self._http.post(path, json={"model": model, **extra})
        except httpx.TransportError as e:
            return ActionResult(False, 0, f"{kind} {model}: server unreachable ({type(e).__name__})")
        return describe(kind, model, response)

    async def aclose(self) -> None:
        await self._http.aclose()
