"""One polled server of `gmlx top`: its client, last snapshot, connection state, reconnect backoff and rate
history. `gmlx top URL...` keeps one per host (no Textual here: the app shows them)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from gmlx_top.client import ApiError, TopClient
from gmlx_top.view import Backoff, History


@dataclass
class HostState:
    client: TopClient
    backoff: Backoff = field(default_factory=Backoff)
    history: History = field(default_factory=History)
    server: Mapping[str, Any] = field(default_factory=dict)
    connection: str = "connecting"
    problem: str = ""

    async def poll(self, interval: float) -> float:
        """Fetch one snapshot; the delay before the next poll (the interval, or the backoff after a failure)."""
        try:
            body = await self.client.fetch()
        except httpx.TransportError as e:
            return self._failed("disconnected", type(e).__name__)
        except (ApiError, ValueError) as e:
            return self._failed("error", str(e))
        self.backoff.reset()
        self.server, self.connection, self.problem = body["server"], "connected", ""
        self.history.record(self.server)
        return interval

    def _failed(self, state: str, reason: str) -> float:
        delay = self.backoff.next()
        self.connection = state
        self.problem = f"{reason}; retrying in {delay:.1f}s (attempt {self.backoff.attempts})"
        return delay


def host_states(clients: list[TopClient], backoff: Backoff | None, history: History | None) -> list[HostState]:
    """One state per client; a given backoff or history is the first host's, the others get copies of it."""
    states = []
    for i, client in enumerate(clients):
        b = backoff if i == 0 or backoff is None else copy.deepcopy(backoff)
        h = history if i == 0 or history is None else copy.deepcopy(history)
        states.append(HostState(client, b or Backoff(), h or History()))
    return states
