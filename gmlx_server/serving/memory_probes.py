"""Memory probes: each reads one source and may fail on its own (the snapshot then nulls its fields).

Sources: MLX's allocator (engine snapshots, never an MLX call from here), this process's RSS, and the
machine's memory (the cgroup limit where one applies, else /proc/meminfo, else sysctl: gmlx_plan.budget).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gmlx_plan.budget import available_memory, total_memory


@dataclass(frozen=True)
class MemoryReading:
    total_bytes: int | None  # the budget the bands are fractions of
    available_bytes: int | None  # what the machine (or cgroup) can still give us
    rss_bytes: int | None
    mlx_active_bytes: int | None
    mlx_cache_bytes: int | None
    budget_configured: bool


def _safe(probe: Callable[[], int | None]) -> int | None:
    try:
        return probe()
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def rss_bytes() -> int | None:
    statm = Path("/proc/self/statm")
    if statm.exists():
        return int(statm.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # no current RSS off Linux: peak is an upper bound
    return int(peak) * (1 if sys.platform == "darwin" else 1024)


def machine_memory() -> tuple[int, int] | None:
    """(total, available) bytes for this process's world: cgroup, else the machine (gmlx_plan's probes)."""
    total, available = total_memory(), available_memory()
    return (total, available) if total is not None and available is not None else None


def read_memory(budget: int | None, mlx: Iterable[Any]) -> MemoryReading:
    """One reading. `mlx` is the resident engines' allocator snapshots (active/cache bytes)."""
    snaps = list(mlx)
    active = sum(s.active_bytes for s in snaps) if snaps else None
    cache = sum(s.cache_bytes for s in snaps) if snaps else None
    try:
        machine = machine_memory()
    except (OSError, ValueError, subprocess.SubprocessError):
        machine = None
    total = budget if budget is not None else (machine[0] if machine else None)
    if budget is not None:
        used = active if active is not None else _safe(rss_bytes)
        available = budget - used if used is not None else None
    else:
        available = machine[1] if machine else None
    return MemoryReading(total, available, _safe(rss_bytes), active, cache, budget is not None)
