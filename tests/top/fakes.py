"""Recorded /v1/metrics snapshots and a scripted TopClient for `gmlx top` tests."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from gmlx_top.app import TopApp
from gmlx_top.client import ActionKind, ActionResult

DATA = Path(__file__).parent / "data"
SIZE = (132, 40)
BUSY_POLLS = 90


def recorded(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text())
    return data


def with_rates(snapshot: dict[str, Any], decode: float, prefill: float) -> dict[str, Any]:
    out = copy.deepcopy(snapshot)
    out["server"]["rates"].update(decode_tok_s=decode, prefill_tok_s_recent=prefill)
    return out


def busy_minute() -> list[dict[str, Any]]:
    """A minute and a half of polls ramping up to the busy recording (the last poll is the recording)."""
    busy = recorded("busy")
    script = []
    for i in range(BUSY_POLLS - 1):
        ramp = min(1.0, i / 30)
        decode = round(ramp * (22 + 4 * math.sin(i / 3)), 2)
        prefill = round(ramp * (400 + 30 * math.cos(i / 5)), 1) if i % 11 else 0.0
        script.append(with_rates(busy, decode, prefill))
    return [*script, busy]


def refused() -> httpx.ConnectError:
    return httpx.ConnectError("[Errno 111] Connection refused")


class FakeClient:
    """Answers fetch() from a script of snapshots or exceptions; the last entry repeats."""

    base_url = "http://127.0.0.1:8080"

    def __init__(self, script: Iterable[dict[str, Any] | Exception],
                 results: dict[ActionKind, ActionResult] | None = None) -> None:
        self.script = list(script)
        self.fetches = 0
        self.actions: list[tuple[ActionKind, str]] = []
        self.results = results or {}
        self.closed = False

    async def fetch(self) -> dict[str, Any]:
        item = self.script[min(self.fetches, len(self.script) - 1)]
        self.fetches += 1
        if isinstance(item, Exception):
            raise item
        return item

    async def action(self, kind: ActionKind, model: str) -> ActionResult:
        self.actions.append((kind, model))
        return self.results.get(kind, ActionResult(True, 200, f"{kind} {model}: done (200)"))

    async def aclose(self) -> None:
        self.closed = True


def app_for(script: Iterable[dict[str, Any] | Exception], **kwargs: Any) -> tuple[TopApp, FakeClient]:
    """An app that polls only when the test says so (unless auto_poll=True)."""
    client = FakeClient(script, kwargs.pop("results", None))
    return TopApp(client, interval=1.0, auto_poll=kwargs.pop("auto_poll", False), **kwargs), client


async def poll(app: TopApp, times: int) -> None:
    for _ in range(times):
        await app.poll_once()
