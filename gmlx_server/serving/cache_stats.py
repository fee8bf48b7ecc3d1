"""Prompt-cache statistics of the resident engines: one reading for /v1/cache/stats and Prometheus; and the disk
tier's directory, which outlives every engine (its usage and its reset)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gmlx_server.config import ModelEntry, ServerConfig, ServerSettings
from gmlx_server.engine.disk_files import clear, kv_layout, model_identity, peek, usage
from gmlx_server.engine.layout import kv_dtype
from gmlx_server.engine.types import Engine

TOTALS = ("bytes", "entries", "tokens_reused", "evictions", "misses")


@dataclass(frozen=True)
class CacheReset:
    models: list[str]  # the resident models whose RAM tiers were emptied
    disk_entries: int | None  # disk files removed; None when the tier is off or was not asked for


DISK_TOTALS = ("hits", "misses", "restored_tokens", "restore_seconds", "read_bytes", "writes", "writes_dropped",
               "skipped_slower_than_prefill", "removed_bad")


def engine_cache_stats(engine: Engine) -> dict[str, Any]:
    """The engine's prompt-cache counters as the JSON body carries them ({"enabled": false} without a cache);
    `disk` only when the disk tier is on."""
    stats = engine.cache_stats()
    if not stats.enabled:
        return {"enabled": False}
    out = {**dataclasses.asdict(stats), "hits": dict(stats.hits)}
    if stats.disk is None:
        del out["disk"]
    return out


def cache_brief(engine: Engine) -> dict[str, Any] | None:
    """A resident model's prompt cache in one line's worth (its /v1/metrics row, gmlx top); None without one."""
    stats = engine.cache_stats()
    if not stats.enabled:
        return None
    out: dict[str, Any] = {"bytes": stats.bytes, "entries": stats.entries, "hits": sum(stats.hits.values()),
                           "misses": stats.misses}
    if stats.disk is not None:
        out["disk"] = {k: stats.disk.get(k) for k in ("bytes", "entries", "hits")}
    return out


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


def disk_section(server: ServerSettings, models: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The disk tier's directory (every model's files together) and the resident models' counters summed;
    None when the tier is off."""
    root = disk_dir(server)
    if root is None:
        return None
    disks = [s["disk"] for s in models.values() if isinstance(s.get("disk"), Mapping)]
    counters = {k: round(sum(d.get(k, 0) for d in disks), 6) for k in DISK_TOTALS}
    return {"dir": server.prompt_cache_dir, "max_bytes": server.prompt_cache_disk_bytes,
            **usage(root), **counters}


def clear_disk(server: ServerSettings, model_id: str | None) -> int | None:
    """Remove the disk tier's files (of one model, or all); None when the tier is off."""
    root = disk_dir(server)
    return clear(root, model_id) if root is not None else None


def disk_dir(server: ServerSettings) -> Path | None:
    """The disk tier's directory; None when server.prompt_cache_disk_bytes leaves the tier off."""
    return Path(server.prompt_cache_dir) if server.prompt_cache_disk_bytes and server.prompt_cache_dir else None


def disk_peek(config: ServerConfig, entry: ModelEntry, prompt: list[int]) -> int:
    """Prompt tokens the disk tier holds for a model that is not loaded; 0 when the tier is off. Blocking."""
    root = disk_dir(config.server)
    if root is None or not os.path.exists(entry.path):
        return 0
    layout = kv_layout(entry.kv_quant, entry.weights, entry.max_kv_size, entry.mmproj, config.env.native_kernels,
                       kv_dtype(entry.kv_dtype, config.env.native_kernels))
    return peek(root, entry.id, model_identity(entry.path), layout, prompt)
