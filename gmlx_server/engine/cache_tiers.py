"""The prompt cache a request's warm start asks: the RAM tiers, and below them the disk tier when configured.

A lookup takes the longest restorable prefix of either. A disk entry is used only when it restores more than RAM
would and reading it should take less time than prefilling the tokens it adds (at the engine's measured paces);
it then also goes into RAM. Runs on the engine thread, as the RAM cache's mutations do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gmlx_plan.pace import PrefillPace, reusable
from gmlx_server.engine.disk_cache import DiskCache, DiskHit
from gmlx_server.engine.prompt_cache import Entry, Hit, PromptCache, common_prefix

log = logging.getLogger(__name__)


class CacheTiers:
    def __init__(self, ram: PromptCache, disk: DiskCache | None = None,
                 prefill: Callable[[], PrefillPace | None] = lambda: None) -> None:
        self.ram, self.disk, self._prefill = ram, disk, prefill

    def lookup(self, prompt: Sequence[int]) -> Hit | None:
        """The hit to restore (counted); a disk hit's Entry is loaded, its restore to be timed by the caller."""
        hit = self.ram.peek(prompt)
        found = self._disk_hit(prompt, hit)
        entry = self.disk.load(found) if self.disk is not None and found is not None else None
        if found is not None and entry is not None:
            self.ram.store(entry, spill=False)  # the next turn finds it in RAM
            hit = Hit(entry, found.tokens, "disk")
        self.ram.record(hit)
        return hit

    def peek(self, prompt: Sequence[int]) -> tuple[str, int]:
        """The tier and warm tokens a request with this prompt would get now, counting nothing (for estimates)."""
        hit = self.ram.peek(prompt)
        found = self._disk_hit(prompt, hit, count=False)
        if found is not None:
            return "disk", found.tokens
        return (hit.tier, hit.tokens) if hit is not None else ("miss", 0)

    def expected(self, prompt: Sequence[int], ahead: Iterable[Sequence[int]]) -> int:
        """The warm tokens a queued prompt should restore when its prefill starts: what the RAM tier holds for it
        now, or the prefix it shares with a prompt ahead of it (stored once that one's prefill ends), as gmlx
        plan's simulator reuses a shared prefix. The disk tier is not read: stats() calls this on the event loop."""
        hit = self.ram.peek(prompt)
        shared = max((common_prefix(prompt, other) for other in ahead), default=0)
        return max(hit.tokens if hit is not None else 0, reusable(shared, len(prompt)))

    def restored(self, hit: Hit, seconds: float) -> None:
        """A hit's restore finished; a disk hit's seconds are the disk tier's restore time."""
        if hit.tier == "disk" and self.disk is not None:
            self.disk.restored(hit.tokens, seconds)

    def store(self, entry: Entry) -> bool:
        return self.ram.store(entry)

    def reset(self) -> None:
        self.ram.reset()

    def published(self) -> dict[str, Any]:
        """The RAM tier's last published counters, with the disk tier's beside them when it is on."""
        stats = dict(self.ram.published)
        if self.disk is not None:
            stats["disk"] = self.disk.stats()
        return stats

    def _disk_hit(self, prompt: Sequence[int], ram: Hit | None, count: bool = True) -> DiskHit | None:
        if self.disk is None:
            return None
        than = ram.tokens if ram is not None else 0
        found = self.disk.best(prompt, than)
        if found is None:
            self.disk.misses += count
            return None
        if self._slower_than_prefill(found, than):
            self.disk.skipped += count
            return None
        return found

    def _slower_than_prefill(self, found: DiskHit, than: int) -> bool:
        """Reading the file should cost more than prefilling the tokens it adds over RAM's hit."""
        assert self.disk is not None
        read_s, pace = self.disk.read_seconds(found), self._prefill()
        if read_s is None or pace is None:
            return False  # nothing measured yet: a restore is a copy, a prefill runs the model
        return read_s > pace.seconds(than, found.tokens)
