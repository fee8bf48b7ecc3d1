"""Fair shares: each caller (a named key, or a client address on a key-less server) holds at most
`max_concurrent` requests in the engines; up to `max_queued` more wait here for one of its slots, by priority
then arrival, and past that a request is a 429 `rate_limited` with Retry-After. One caller filling its share
never stops another's requests.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from gmlx_plan.key_share import KeySplit, split
from gmlx_server.config import FairShare, KeyScope, ServerSettings
from gmlx_server.engine.types import RequestHandle, TokenEvent
from gmlx_server.errors import InvalidRequest, RateLimited, clip

ANONYMOUS = "anonymous"  # the metrics label of a key-less server's callers (addresses are no labels)


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the key's name (None on a key-less server), the client address, the key's scope and
    the share it may hold."""

    key: str | None
    address: str
    scope: KeyScope = "admin"
    share: FairShare = field(default_factory=FairShare)

    @property
    def who(self) -> str:
        return f"key '{self.key}'" if self.key else f"client {self.address}"

    @property
    def label(self) -> str:
        return self.key or ANONYMOUS


@dataclass(order=True)
class _Waiter:
    priority: int
    seq: int
    slot: asyncio.Future[None] = field(compare=False)


class FairShares:
    def __init__(self) -> None:
        self._held: dict[str, int] = {}
        self._waiting: dict[str, list[_Waiter]] = {}
        self._seq = itertools.count()

    def waiting(self, who: str) -> int:
        return len(self._waiting.get(who, ()))

    def held(self, who: str) -> int:
        return self._held.get(who, 0)

    async def enter(self, caller: Caller, priority: int, retry_after_s: Callable[[], float]) -> Callable[[], None]:
        """Take one of the caller's slots, waiting for one while its queue has room; the release to call once
        the request has ended (calling it again does nothing)."""
        share, who = caller.share, caller.who
        if share.max_concurrent is None:
            return _noop
        queue = self._waiting.setdefault(who, [])
        if self.held(who) < share.max_concurrent and not queue:
            self._held[who] = self.held(who) + 1
            return self._release_once(who)
        if share.max_queued is not None and len(queue) >= share.max_queued:
            retry = retry_after_s()
            raise RateLimited(f"rate limited: {who} has {self.held(who)} requests running and {len(queue)} waiting "
                              f"(its share: max_concurrent {share.max_concurrent}, max_queued {share.max_queued}); "
                              f"retry after {max(1, round(retry))} s", retry)
        waiter = _Waiter(priority, next(self._seq), asyncio.get_running_loop().create_future())
        queue.append(waiter)
        queue.sort()
        try:
            await waiter.slot  # a release hands its slot over: `held` does not change
        except asyncio.CancelledError:
            if waiter.slot.done() and not waiter.slot.cancelled():
                self._release(who)  # the slot arrived as the wait was cancelled: pass it on
            elif waiter in queue:
                queue.remove(waiter)
            raise
        return self._release_once(who)

    def _release_once(self, who: str) -> Callable[[], None]:
        done = False

        def release() -> None:
            nonlocal done
            if not done:
                done = True
                self._release(who)
        return release

    def _release(self, who: str) -> None:
        queue = self._waiting.get(who, [])
        while queue:
            waiter = queue.pop(0)
            if not waiter.slot.done():
                waiter.slot.set_result(None)
                return
        held = self.held(who) - 1
        if held > 0:
            self._held[who] = held
        else:  # an idle caller leaves nothing behind: a key-less server sees many addresses
            self._held.pop(who, None)
            self._waiting.pop(who, None)


def _noop() -> None:
    return None


class Released:
    """A handle that gives its caller's slot back when its final event passes, when it is cancelled (the
    client left), or when its reader stops early."""

    def __init__(self, inner: RequestHandle, release: Callable[[], None]) -> None:
        self.request_id = inner.request_id
        self._inner, self._release = inner, release

    def cancel(self) -> None:
        self._inner.cancel()
        self._release()

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[TokenEvent]:
        try:
            async for ev in self._inner:
                if ev.finish_reason is not None:
                    self._release()
                yield ev
        finally:
            self._release()


def key_split(server: ServerSettings, name: str, width: int) -> KeySplit:
    """How a fan-out of `width` from key `name` divides under its share (a 400 naming `key` for no such key)."""
    key = next((k for k in server.keys if k.name == name), None)
    if key is None:
        names = ", ".join(k.name for k in server.keys) or "none: this server has no keys"
        raise InvalidRequest(f"'key': no key is named {clip(name)!r} (names: {names})", param="key")
    share = key.share or server.fair_share
    return split(name, width, share.max_concurrent, share.max_queued)


def with_key(plan: dict[str, Any], share: KeySplit, width: int) -> dict[str, Any]:
    """/v1/capacity/plan for a key: the plan at the width its share runs, the split, and refusals as a reason."""
    out = {**plan, "width": width, "key": share.as_json()}
    if share.refused and out.get("admit_now"):
        out["admit_now"], out["reason"] = False, share.text()
    return out
