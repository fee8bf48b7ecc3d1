"""Prompt-cache statistics of the resident engines: one reading for /v1/cache/stats and Prometheus."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gmlx_server.engine.types import Engine

TOTALS = ("bytes", "entries", "tokens_reused", "evictions", "misses")


def engine_cache_stats(engine: Engine) -> dict[str, Any]:
    """The engine's prompt-cache counters as the JSON body carries them ({"enabled": false} without a cache)."""
    stats = engine.cache_stats()
    return {**dataclasses.asdict(stats), "hits": dict(stats.hits)} if stats.enabled else {"enabled": False}


def resident_cache_stats(engines: Mapping[str, Engine]) -> dict[str, dict[str, Any]]:
    """Per resident model whose prompt cache is on: its published counters (no engine-thread wait)."""
    models = {m: engine_cache_stats(e) for m, e in engines.items()}
    return {m: s for m, s in models.items() if s.get("enabled")}


def cache_totals(models: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    hits: dict[str, int] = {}
    for s in models.values():
        for tier, n in s.get("hits", {}).items():
            hits[tier] = hits.get(tier, 0) + n
    return {**{k: sum(int(s.get(k, 0)) for s in models.values()) for k in TOTALS}, "hits": hits}
