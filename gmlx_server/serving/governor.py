"""The memory governor: bands from the free working set, and shedding the largest stream in red.

green/yellow/orange/red are fractions of the budget that are still free. In red, while requests
stream, the one of the lowest priority holding the most tokens ends with `server_overloaded_shed`; nothing
else is lost.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from gmlx_server.engine.types import Engine
from gmlx_server.serving.memory_probes import MemoryReading

Band = Literal["green", "yellow", "orange", "red"]
BANDS: tuple[Band, ...] = ("green", "yellow", "orange", "red")
# Free fraction at or above which each band holds; below the last one it is red.
THRESHOLDS: tuple[tuple[Band, float], ...] = (("green", 0.25), ("yellow", 0.15), ("orange", 0.05))
log = logging.getLogger("gmlx.governor")


def band_for(reading: MemoryReading) -> Band | None:
    if reading.total_bytes is None or reading.available_bytes is None or reading.total_bytes <= 0:
        return None
    free = reading.available_bytes / reading.total_bytes
    return next((b for b, t in THRESHOLDS if free >= t), "red")


@dataclass
class ShedChoice:
    model_id: str
    request_id: str
    tokens: int


def largest_stream(engines: Mapping[str, Engine]) -> ShedChoice | None:
    """The streaming request (prefilling or decoding) of the lowest priority (the highest number) that holds the
    most KV among those: prompt + generated tokens."""
    best: tuple[int, int] | None = None
    choice: ShedChoice | None = None
    for model_id, engine in engines.items():
        for row in engine.stats().rows:
            rank = (row.priority, row.prompt_tokens + row.generated)
            if row.state in ("prefill", "decode") and (best is None or rank > best):
                best, choice = rank, ShedChoice(model_id, row.request_id, rank[1])
    return choice


class Governor:
    def __init__(self, enabled: bool, read: Callable[[], MemoryReading]) -> None:
        self.enabled, self._read = enabled, read
        self.band: Band | None = None
        self.band_changes: Counter[str] = Counter()  # band entered -> count
        self.sheds = 0
        self.last_reading: MemoryReading | None = None
        # A shed takes effect at the engine's next step; until its victim is gone and one more reading
        # has been taken, memory still shows the victim's KV, so no second request is shed.
        self._pending: str | None = None
        self._settle = False

    def read(self) -> MemoryReading:
        return self._read()

    def evaluate(self, engines: Mapping[str, Engine]) -> Band | None:
        """Read memory, update the band, and shed in red. Called periodically off the request path."""
        reading = self._read()
        self.last_reading = reading
        band = band_for(reading)
        if band != self.band and band is not None:
            self.band_changes[band] += 1
            log.info("memory band %s -> %s (%s of %s bytes free)", self.band, band, reading.available_bytes,
                     reading.total_bytes)
        self.band = band
        if self.enabled and band == "red":
            self._shed(engines, reading)
        return band

    def _still_settling(self, engines: Mapping[str, Engine]) -> bool:
        if self._pending is not None:
            live = {r.request_id for e in engines.values() for r in e.stats().rows}
            if self._pending in live:
                return True
            self._pending, self._settle = None, True
        if self._settle:
            self._settle = False
            return True
        return False

    def _shed(self, engines: Mapping[str, Engine], reading: MemoryReading) -> None:
        if self._still_settling(engines):
            return
        choice = largest_stream(engines)
        if choice is None:
            return
        reason = (f"server_overloaded_shed: memory ran out ({reading.available_bytes} of {reading.total_bytes} "
                  f"bytes free); this request held the most tokens ({choice.tokens}) "
                  "of the lowest priority streaming")
        if engines[choice.model_id].shed(choice.request_id, reason):
            self.sheds += 1
            self._pending = choice.request_id
            log.warning("shed request %s of model %s (%d tokens)", choice.request_id, choice.model_id,
                        choice.tokens)

    @property
    def pressure(self) -> bool:
        return self.enabled and self.band in ("orange", "red")
