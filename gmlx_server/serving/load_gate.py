"""The load gate (docs/architecture.md, "The memory model"): a model loads only when its weights fit beside the resident
models that are pinned or busy, and leave the governor's floor free.

The floor is the red band's edge: 5% of the budget (the governor's `total_bytes`) stays free after a load.
Idle unpinned models are evicted least recently used first to make room (kept ones too: a keep only outlasts
the idle timeout). Then the gate waits up to 3 s for the reading to show the room, since an unloaded model's
memory can take that long to come back from the kernel; past that it answers 503 `model_load_deferred`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from gmlx_plan.queueing import retry_after_s
from gmlx_server.engine.types import Engine
from gmlx_server.errors import ModelLoadDeferred
from gmlx_server.serving.governor import THRESHOLDS, Governor
from gmlx_server.serving.memory_probes import MemoryReading
from gmlx_server.serving.residency import Residency, streaming


class HeldWeights:
    """Weights loaded beside the chat engines (the service models), which no eviction frees, by a name the
    gate's refusals show: the services write them as their models load and close (on their worker threads),
    the gate reads them."""

    def __init__(self) -> None:
        self._bytes: dict[str, int] = {}
        self._lock = threading.Lock()

    def hold(self, name: str, nbytes: int) -> None:
        with self._lock:
            self._bytes[name] = nbytes

    def release(self, name: str) -> None:
        with self._lock:
            self._bytes.pop(name, None)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._bytes)

FLOOR_FRACTION = THRESHOLDS[-1][1]  # the red band starts below this free fraction
RETURN_WAIT_S = 3.0
POLL_S = 0.1
IDLE_RETRY_S = 5.0  # Retry-After when no busy model's drain time says better


def free_bytes(reading: MemoryReading) -> int | None:
    """Free memory as the budget counts it. A configured budget counts MLX memory (the capacity table's
    meaning); with no engine resident MLX holds nothing, so the reading's RSS fallback does not apply."""
    if reading.budget_configured and reading.mlx_active_bytes is None:
        return reading.total_bytes
    return reading.available_bytes


@dataclass(frozen=True)
class GateFigures:
    model_id: str
    need: int  # the candidate's weights
    budget: int
    floor: int
    held: int  # weights of the pinned or busy resident models
    held_models: tuple[str, ...]
    free: int | None = None  # the governor's reading after any eviction

    def refuse(self, why: str, retry_s: float) -> ModelLoadDeferred:
        secs = retry_after_s(retry_s)
        err = ModelLoadDeferred(f"model '{self.model_id}' cannot load now: its weights need {self.need} bytes; "
                                f"{why}; retry after {secs} s", secs)
        err.extra.update({"need_bytes": self.need, "budget_bytes": self.budget, "floor_bytes": self.floor,
                          "held_bytes": self.held, "held_models": list(self.held_models), "free_bytes": self.free})
        return err

    def beside_held(self) -> str:
        names = ", ".join(self.held_models) or "none"
        room = self.budget - self.held - self.floor
        return (f"the memory budget of {self.budget} bytes, less {self.held} bytes held by pinned or busy "
                f"resident models ({names}) and the governor's floor of {self.floor} bytes, leaves {room}")

    def measured(self, waited_s: float) -> str:
        return (f"the governor reads {self.free} of {self.budget} bytes free, which would leave less than the "
                f"floor of {self.floor} bytes after the load (waited {waited_s:g} s for memory from an unload)")


class GateHost(Protocol):
    residency: Residency
    governor: Governor

    @property
    def resident(self) -> Mapping[str, Engine]: ...

    def is_pinned(self, model_id: str) -> bool: ...

    def weights_of(self, model_id: str) -> int: ...

    def held_elsewhere(self) -> Mapping[str, int]:
        """Weights loaded beside the chat engines (the services' models), which no eviction frees."""
        ...

    async def evict(self, model_id: str) -> None: ...

    def drain_eta_s(self, model_ids: Iterable[str]) -> float | None: ...


class LoadGate:
    def __init__(self, host: GateHost, wait_s: float = RETURN_WAIT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.host, self.wait_s, self.clock = host, wait_s, clock

    async def admit(self, model_id: str, need: int) -> None:
        """Return when `need` bytes of weights may load; evicts idle models for room; else ModelLoadDeferred."""
        deadline = self.clock() + self.wait_s
        while True:
            figures = await self._attempt(model_id, need)
            if figures is None:
                return
            if self.clock() >= deadline:
                raise figures.refuse(figures.measured(self.wait_s), IDLE_RETRY_S)
            await asyncio.sleep(POLL_S)

    async def _attempt(self, model_id: str, need: int) -> GateFigures | None:
        """None when the load fits now; the figures when it may fit after a wait. Raises when held models
        alone leave too little (no wait helps before they finish or are unloaded)."""
        h = self.host
        budget = h.governor.read().total_bytes
        if budget is None:
            return None  # nothing to judge against
        c = h.residency.classify(h.resident, h.is_pinned)
        weights = {m: h.weights_of(m) for m in h.resident}
        others = h.held_elsewhere()
        held = sum(weights[m] for m in c.held) + sum(others.values())
        figures = GateFigures(model_id, need, budget, int(budget * FLOOR_FRACTION), held, (*c.held, *others))
        if budget - held - figures.floor < need:
            raise figures.refuse(figures.beside_held(), self._retry_s(c.held))
        spare = budget - figures.floor - need - sum(weights.values()) - sum(others.values())
        for victim in c.evictable:  # least recently used first, only as many as the room needs
            if spare >= 0:
                break
            await h.evict(victim)
            spare += weights[victim]
        free = free_bytes(h.governor.read())
        if spare >= 0 and (free is None or free - need >= figures.floor):
            return None
        return replace(figures, free=free)

    def _retry_s(self, held: list[str]) -> float:
        busy = [m for m in held if streaming(self.host.resident[m])]
        eta = self.host.drain_eta_s(busy) if busy else None
        return eta if eta is not None else IDLE_RETRY_S
