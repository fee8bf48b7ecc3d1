"""A key's fair share of a fan-out: of `width` requests sent at once, how many run, how many wait inside the server
for one of the key's slots, and how many get 429 rate_limited. The server's admission (serving/fair_share.py)
and `gmlx plan --key` / `/v1/capacity/plan?key=` answer with this one rule."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gmlx_plan.source import PlanInputError

LEGACY_KEY = "default"  # server.api_key's name: no share of its own, the server's fair_share


@dataclass(frozen=True)
class KeySplit:
    name: str
    max_concurrent: int | None
    max_queued: int | None
    runs: int
    waits: int
    refused: int

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "max_concurrent": self.max_concurrent, "max_queued": self.max_queued,
                "runs": self.runs, "waits": self.waits, "refused": self.refused}

    def text(self) -> str:
        cap = "no limit" if self.max_concurrent is None else (
            f"max_concurrent {self.max_concurrent}, max_queued "
            f"{'no limit' if self.max_queued is None else self.max_queued}")
        return (f"key {self.name} ({cap}): {self.runs} run at once, {self.waits} wait for a slot, "
                f"{self.refused} get 429 rate_limited")


def split(name: str, width: int, max_concurrent: int | None, max_queued: int | None) -> KeySplit:
    if max_concurrent is None:
        return KeySplit(name, None, max_queued, width, 0, 0)
    runs = min(width, max_concurrent)
    waits = width - runs if max_queued is None else min(width - runs, max_queued)
    return KeySplit(name, max_concurrent, max_queued, runs, waits, width - runs - waits)


def key_split(config: Mapping[str, Any], name: str, width: int) -> KeySplit:
    """The share of key `name` in a gmlx YAML config (already loaded): its own limits, else server.fair_share."""
    server = config.get("server") or {}
    default = server.get("fair_share") or {}
    entries = [e for e in server.get("api_keys") or [] if isinstance(e, Mapping)]
    names = [str(e.get("name")) for e in entries] + ([LEGACY_KEY] if server.get("api_key") else [])
    if name not in names:
        raise PlanInputError(f"--key {name}: no such key in the config (keys: {', '.join(names) or 'none'})")
    entry = next((e for e in entries if e.get("name") == name), {})
    own = any(k in entry for k in ("max_concurrent", "max_queued"))
    limits = entry if own else default
    return split(name, width, limits.get("max_concurrent"), limits.get("max_queued"))
