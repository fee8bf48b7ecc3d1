"""H identical gmlx hosts behind a least-connections balancer (deploy/haproxy): what the fleet admits, and
a fan-out wave over it.

  split      W requests arriving together go out by least connections: W mod H hosts take ceil(W/H),
             the others floor(W/H)
  admits     each host starts min(share, slots) at once and queues up to its queue cap; the rest of its
             share is refused (503). A host's queue counts only requests waiting for a slot, as the
             server's admission does, so a fleet takes H x (slots + queue cap) at once
  retries    a request one host refuses would be refused by every host (identical hosts fill together),
             so the balancer's retries place nothing more and the fleet is H independent hosts: a wave
             is simulated once per distinct share and the hosts' outcomes put together
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gmlx_plan.pace import Paces
from gmlx_plan.queueing import Rates
from gmlx_plan.simulate import ServerSide, SimResult, Workload, simulate


def shares(width: int, hosts: int) -> tuple[int, ...]:
    """Each host's part of `width` requests arriving together, largest first."""
    base, extra = divmod(max(0, width), max(1, hosts))
    return tuple(base + (i < extra) for i in range(max(1, hosts)))


@dataclass(frozen=True)
class FleetAdmission:
    hosts: int
    width: int
    slots: int  # decode slots per host (the decode width, or fewer when memory holds fewer streams)
    queue_cap: int

    @property
    def capacity(self) -> int:
        """Requests the fleet takes at once: every slot busy and every queue full."""
        return self.hosts * (self.slots + self.queue_cap)

    @property
    def start(self) -> int:
        return sum(min(s, self.slots) for s in shares(self.width, self.hosts))

    @property
    def wait(self) -> int:
        return sum(min(max(0, s - self.slots), self.queue_cap) for s in shares(self.width, self.hosts))

    @property
    def refused(self) -> int:
        return self.width - self.start - self.wait

    def as_json(self) -> dict[str, Any]:
        return {"hosts": self.hosts, "width": self.width, "per_host": list(shares(self.width, self.hosts)),
                "slots_per_host": self.slots, "queue_cap_per_host": self.queue_cap, "capacity": self.capacity,
                "start_now": self.start, "wait": self.wait, "refused_503": self.refused}

    def text(self) -> str:
        per = shares(self.width, self.hosts)
        split = f"{per[0]} each" if per[0] == per[-1] else f"{per[0]} or {per[-1]} each"
        return (f"fleet: {self.hosts} hosts x {self.slots} slots + queue cap {self.queue_cap} take "
                f"{self.capacity} requests at once; a wave of {self.width} ({split}): {self.start} start, "
                f"{self.wait} wait, {self.refused} refused (503 + Retry-After)")


def simulate_fleet(work: Workload, server: ServerSide, rates: Paces | Rates, hosts: int) -> SimResult:
    """The fan-out over `hosts` hosts: one simulation per distinct share, the hosts' outcomes together. Waves,
    drains and the timeline are the busiest host's (it ends each wave last)."""
    split = shares(work.width, hosts)
    runs = {share: simulate(replace(work, width=share), server, rates) for share in set(split)}
    busiest = runs[split[0]]
    outcomes = tuple(o for share in split for o in runs[share].outcomes)
    return replace(busiest, outcomes=outcomes, drain_s=max(r.drain_s for r in runs.values()))
