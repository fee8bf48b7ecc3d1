"""The ignored-fields warning: an agent sends the same ignored fields on every request, so the WARNING is
written once per client and field set an hour (logger gmlx.params); telemetry counts every occurrence."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from gmlx_server.serving.telemetry import Telemetry

log = logging.getLogger("gmlx.params")
REPEAT_S = 3600.0  # a client's same field set is warned about again after an hour
MAX_KEYS = 4096  # remembered (client, field set) pairs; older ones are forgotten first


class IgnoredFields:
    def __init__(self, telemetry: Telemetry, clock: Callable[[], float] = time.monotonic) -> None:
        self.telemetry, self.clock = telemetry, clock
        self._warned: dict[tuple[str, tuple[str, ...]], float] = {}

    def note(self, client: str, path: str, names: Sequence[str]) -> None:
        if not names:
            return
        self.telemetry.ignored_fields.update(names)
        key, now = (client, tuple(names)), self.clock()
        last = self._warned.get(key)
        if last is not None and now - last < REPEAT_S:
            return
        self._warned.pop(key, None)  # re-inserted last: the dict stays in warning order
        self._warned[key] = now
        while len(self._warned) > MAX_KEYS:
            del self._warned[next(iter(self._warned))]
        log.warning("%s: ignored parameters: %s", path, ", ".join(names))
