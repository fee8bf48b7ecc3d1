"""Fair shares: a caller holds at most max_concurrent slots, up to max_queued more wait (by priority, then arrival),
the rest get 429 rate_limited with Retry-After; a release hands the slot to the next waiter; a cancelled wait
leaves the queue; another caller is never held up."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gmlx_server.config import FairShare
from gmlx_server.engine.types import TokenEvent
from gmlx_server.errors import RateLimited
from gmlx_server.serving.fair_share import Caller, FairShares, Released

ALICE = Caller("alice", "127.0.0.1", "client", FairShare(max_concurrent=2, max_queued=2))
BOB = Caller("bob", "127.0.0.1", "client", FairShare(max_concurrent=1, max_queued=0))


def eta() -> float:
    return 7.0


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_slots_queue_and_refusals() -> None:
    async def run() -> None:
        shares = FairShares()
        held = [await shares.enter(ALICE, 0, eta) for _ in range(2)]
        waiting = [asyncio.create_task(shares.enter(ALICE, 0, eta)) for _ in range(2)]
        await settle()
        assert shares.held("key 'alice'") == 2 and shares.waiting("key 'alice'") == 2
        with pytest.raises(RateLimited) as e:
            await shares.enter(ALICE, 0, eta)
        assert e.value.status == 429 and e.value.headers["Retry-After"] == "7" and "max_queued 2" in e.value.message
        bob = await shares.enter(BOB, 0, eta)  # another caller is not held up by alice's full share
        with pytest.raises(RateLimited):
            await shares.enter(BOB, 0, eta)
        held[0]()
        held[0]()  # a second call gives nothing back twice
        await settle()
        assert waiting[0].done() and not waiting[1].done() and shares.held("key 'alice'") == 2
        bob()
        assert shares.held("key 'bob'") == 0
        for t in waiting[1:]:
            t.cancel()

    asyncio.run(run())


def test_waiters_are_served_by_priority_then_arrival() -> None:
    async def run() -> None:
        shares = FairShares()
        one = Caller("c", "-", "client", FairShare(max_concurrent=1, max_queued=5))
        release = await shares.enter(one, 0, eta)
        order: list[str] = []

        async def wait(name: str, priority: int) -> None:
            (await shares.enter(one, priority, eta))()
            order.append(name)

        tasks = [asyncio.create_task(wait(n, p)) for n, p in (("batch1", 10), ("batch2", 10), ("interactive", -10))]
        await settle()
        release()
        await asyncio.gather(*tasks)
        assert order == ["interactive", "batch1", "batch2"]

    asyncio.run(run())


def test_a_cancelled_wait_leaves_the_queue() -> None:
    async def run() -> None:
        shares = FairShares()
        release = await shares.enter(BOB, 0, eta)
        patient = Caller("bob", "-", "client", FairShare(max_concurrent=1, max_queued=1))
        task = asyncio.create_task(shares.enter(patient, 0, eta))
        await settle()
        task.cancel()
        await settle()
        assert shares.waiting("key 'bob'") == 0
        release()
        assert shares.held("key 'bob'") == 0

    asyncio.run(run())


def test_no_share_means_no_limit() -> None:
    async def run() -> None:
        shares = FairShares()
        free = Caller(None, "10.0.0.9", "admin")
        for _ in range(50):
            await shares.enter(free, 0, eta)
        assert shares.held("client 10.0.0.9") == 0

    asyncio.run(run())


class Handle:
    request_id = "r1"

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    async def _events(self) -> AsyncIterator[TokenEvent]:
        yield TokenEvent("a", 1)
        yield TokenEvent("", None, finish_reason="stop")

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self._events()


def test_the_handle_gives_its_slot_back_once() -> None:
    calls: list[int] = []
    wrapped = Released(Handle(), lambda: calls.append(1))

    async def read() -> list[str | None]:
        return [ev.finish_reason async for ev in wrapped]

    assert asyncio.run(read()) == [None, "stop"] and calls  # released at the final event (and again: a no-op)
    inner = Handle()
    left = Released(inner, lambda: calls.append(2))
    left.cancel()
    assert inner.cancelled and calls[-1] == 2
