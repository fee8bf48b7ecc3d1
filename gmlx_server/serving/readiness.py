"""/health?ready=1: a coarse verdict a load balancer can act on, read without waiting on any engine."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gmlx_server.serving.drain import RETRY_AFTER_S

if TYPE_CHECKING:
    from gmlx_server.engine.types import Engine
    from gmlx_server.serving.drain import Drain
    from gmlx_server.serving.governor import Governor
    from gmlx_server.serving.model_files import ModelFiles
    from gmlx_server.serving.supervisor import Supervisor


class ReadyHost(Protocol):
    """What the readiness verdict reads of the model host."""

    drain: Drain
    files: ModelFiles
    supervisor: Supervisor
    governor: Governor

    @property
    def resident(self) -> Mapping[str, Engine]: ...

    def default_id(self) -> str | None: ...


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str | None  # one word: draining | model | restarting | pressure | queue | busy
    retry_after_s: int | None
    in_flight: int
    waiting: int


def readiness_of(host: ReadyHost) -> Readiness:
    """draining (SIGTERM: the host is stopping), model (the default model's file cannot load), restarting
    (an engine died and waits out its backoff), pressure (orange/red band), then queue (someone waits), then
    busy (no free slot)."""
    engines = host.resident
    stats = [e.stats() for e in engines.values()]
    waiting = sum(s.waiting for s in stats)
    in_flight = sum(s.in_flight for s in stats)
    if host.drain.active:
        return Readiness(False, "draining", RETRY_AFTER_S, in_flight, waiting)
    default = host.default_id()
    if default is not None and host.files.problem(default) is not None:
        return Readiness(False, "model", 30, in_flight, waiting)
    down = host.supervisor.down
    if down or any(e.fault is not None for e in engines.values()):
        wait = max(1, round(min((host.supervisor.wait_s(m) for m in down), default=1.0)))
        return Readiness(False, "restarting", wait, in_flight, waiting)
    if host.governor.pressure:
        return Readiness(False, "pressure", 5, in_flight, waiting)
    if waiting > 0:
        return Readiness(False, "queue", 2, in_flight, waiting)
    if stats and all(s.in_flight >= s.decode_batch for s in stats):
        return Readiness(False, "busy", 1, in_flight, waiting)
    return Readiness(True, None, None, in_flight, waiting)
