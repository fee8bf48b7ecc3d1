"""Engine supervision bookkeeping: which models lost their engine, why, and when each may load again.

An engine whose thread died is unloaded at once (its requests end with a typed error) and restarted after a
backoff that doubles with each death in a row, so a model that keeps failing cannot spin the server. Pure
bookkeeping on a clock; the host does the unloading and loading.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 60.0
STABLE_S = 300.0  # an engine that served this long before dying starts the backoff over


@dataclass
class Outage:
    reason: str
    due: float  # clock time when the next load may start
    streak: int  # deaths in a row, each doubling the wait


class Supervisor:
    def __init__(self, clock: Callable[[], float] = time.monotonic, base_s: float = BACKOFF_BASE_S,
                 max_s: float = BACKOFF_MAX_S, stable_s: float = STABLE_S) -> None:
        self.clock, self.base_s, self.max_s, self.stable_s = clock, base_s, max_s, stable_s
        self._down: dict[str, Outage] = {}
        self._up_since: dict[str, float] = {}
        self._streak: dict[str, int] = {}
        self.restarts: dict[str, int] = {}  # engine deaths per model since the server started

    def died(self, model_id: str, reason: str) -> float:
        """Record a death (or a failed restart); the seconds until the next load may start."""
        now = self.clock()
        up = self._up_since.pop(model_id, None)
        streak = 0 if up is not None and now - up >= self.stable_s else self._streak.get(model_id, 0)
        self._streak[model_id] = streak + 1
        self.restarts[model_id] = self.restarts.get(model_id, 0) + 1
        wait = min(self.max_s, self.base_s * 2.0**streak)
        self._down[model_id] = Outage(reason, now + wait, streak + 1)
        return wait

    def up(self, model_id: str) -> None:
        """The model's engine loaded (again): it serves from now."""
        self._down.pop(model_id, None)
        self._up_since[model_id] = self.clock()

    def forget(self, model_id: str) -> None:
        """A reload removed the model: no restart is owed."""
        self._down.pop(model_id, None)

    def due(self) -> list[str]:
        now = self.clock()
        return [m for m, o in self._down.items() if o.due <= now]

    def outage(self, model_id: str) -> Outage | None:
        return self._down.get(model_id)

    def wait_s(self, model_id: str) -> float:
        o = self._down.get(model_id)
        return max(0.0, o.due - self.clock()) if o is not None else 0.0

    @property
    def down(self) -> list[str]:
        return list(self._down)
