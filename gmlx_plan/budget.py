"""Memory sizes: parse "64GiB"-style strings, and measure what this machine can give a model.

The measured default is the memory available now (Linux: MemAvailable, capped by the cgroup's
limit minus its usage; macOS: hw.memsize, as nothing else is running) minus a safety floor of
max(512 MiB, 10 %) of it, kept for the OS, the Python process and MLX's allocator slack.
A size given by the operator (--memory, server.memory_budget) is used as is.
"""

from __future__ import annotations

import platform
import re
import subprocess
from pathlib import Path

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
FLOOR_MIN = 512 << 20
FLOOR_FRACTION = 0.10


def parse_memory(text: str | int) -> int:
    """'64GiB', '24G', '512MiB', '1.5 GB', '1073741824' -> bytes (units are binary, like the config's)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise ValueError(f"memory must be positive, got {text}")
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", str(text).lower())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"expected bytes or a size like 64GiB, 24G or 512MiB; got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def parse_disk_cap(text: str | int, name: str) -> int:
    """A disk cap: 0 (off) or a size parse_memory reads; refused by `name` otherwise."""
    if str(text).strip() == "0":
        return 0
    try:
        return parse_memory(text)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def format_bytes(n: float) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def safety_floor(available: int) -> int:
    return max(FLOOR_MIN, int(available * FLOOR_FRACTION))


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" = no limit


def _meminfo_field(field: str, meminfo: Path) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def meminfo_available(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    return _meminfo_field("MemAvailable", meminfo)


def cgroup_headroom(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The cgroup's limit minus its usage (v2, then v1), or None without a limit."""
    for limit, usage in (("memory.max", "memory.current"),
                         ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        cap = _read_int(root / limit)
        if cap is not None and cap < 1 << 60:  # v1 writes a huge number for "no limit"
            return max(0, cap - (_read_int(root / usage) or 0))
    return None


def _darwin_memsize() -> int | None:
    try:
        out = subprocess.run(["sysctl", "-n", "hw.memsize"], capture_output=True, text=True, timeout=5, check=True)
        return int(out.stdout.strip())
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def meminfo_total(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    return _meminfo_field("MemTotal", meminfo)


def cgroup_limit(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    for limit in ("memory.max", "memory/memory.limit_in_bytes"):
        cap = _read_int(root / limit)
        if cap is not None and cap < 1 << 60:
            return cap
    return None


def total_memory() -> int | None:
    """The memory this process's world has in all: the cgroup limit where one applies, else the machine's."""
    if platform.system() == "Darwin":
        return _darwin_memsize()
    found = [v for v in (meminfo_total(), cgroup_limit()) if v is not None]
    return min(found) if found else None


def available_memory() -> int | None:
    """What this machine can give now, before the safety floor; None when nothing can be read."""
    if platform.system() == "Darwin":
        return _darwin_memsize()
    found = [v for v in (meminfo_available(), cgroup_headroom()) if v is not None]
    return min(found) if found else None


def default_budget() -> int:
    avail = available_memory()
    if avail is None:
        raise RuntimeError("cannot measure this machine's memory: pass --memory")
    return max(0, avail - safety_floor(avail))
