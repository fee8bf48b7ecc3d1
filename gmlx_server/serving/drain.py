"""A host's graceful stop behind a load balancer: stop admitting, report not ready, let streams finish, then go.

`gmlx serve` begins the drain on SIGTERM (what Kubernetes, systemd and docker send). From then on
/health?ready=1 answers 503 `draining` (the balancer stops sending new work within its check interval),
every new POST gets a typed 503 with Retry-After (a balancer retries it on another host, as it never
started), and the requests already admitted run to their end. Past the deadline the ones still running
are shed (each stream ends with a typed error event the client sees), and a few seconds later the process
exits whatever remains.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from gmlx_server.errors import ServerOverloaded

if TYPE_CHECKING:  # gmlx serve imports this module before MLX may load
    from gmlx_server.engine.types import Engine

DEFAULT_DRAIN_S = 25.0  # under Kubernetes' default 30 s grace period, so the drain ends before SIGKILL
SHED_GRACE_S = 3.0  # after the shed, how long the streams get to send their error event
RETRY_AFTER_S = 2  # a client retrying a draining host's 503 should land on another host at once
SHUTDOWN_REASON = "the server is shutting down (draining); retry on another host"

Step = Literal["wait", "shed", "exit"]


@dataclass
class Drain:
    """The drain's clock: `step(busy)` says what the serving loop does on each tick."""

    clock: Callable[[], float] = time.monotonic
    deadline_s: float = DEFAULT_DRAIN_S
    since: float | None = field(default=None, init=False)
    shed_at: float | None = field(default=None, init=False)

    @property
    def active(self) -> bool:
        return self.since is not None

    def begin(self, deadline_s: float | None = None) -> bool:
        """Start draining; False when already draining (a second signal then means: stop now)."""
        if self.since is not None:
            return False
        if deadline_s is not None:
            self.deadline_s = deadline_s
        self.since = self.clock()
        return True

    def step(self, busy: bool) -> Step:
        """exit once nothing runs; shed once at the deadline; exit SHED_GRACE_S after the shed."""
        if self.since is None:
            return "wait"
        if not busy:
            return "exit"
        now = self.clock()
        if self.shed_at is None:
            if now - self.since < self.deadline_s:
                return "wait"
            self.shed_at = now
            return "shed"
        return "exit" if now - self.shed_at >= SHED_GRACE_S else "wait"

    def refusal(self) -> ServerOverloaded:
        return ServerOverloaded(SHUTDOWN_REASON, RETRY_AFTER_S)


def shed_all(engines: Mapping[str, Engine]) -> int:
    """End every request still running or waiting with finish_reason `shed`; how many were asked."""
    n = 0
    for engine in engines.values():
        for row in engine.stats().rows:
            n += bool(engine.shed(row.request_id, SHUTDOWN_REASON))
    return n
