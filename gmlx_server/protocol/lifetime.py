"""Durations as Ollama reads `keep_alive`: Go's time.ParseDuration syntax ("10m", "1h30m", "1.5h", "300ms",
"-1m"), plus a bare number of seconds ("600", as OLLAMA_KEEP_ALIVE takes it). Pure: ValueError when not one."""

from __future__ import annotations

import re

UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER = r"(?:\d+\.?\d*|\.\d+)"
_UNIT = "(?:ns|us|µs|μs|ms|s|m|h)"  # ms before m and s: the longest unit that matches wins, as in Go
_TERM = re.compile(f"({_NUMBER})({_UNIT})")
_DURATION = re.compile(f"[+-]?(?:{_NUMBER}{_UNIT})+")
_SECONDS = re.compile(f"[+-]?{_NUMBER}")
PATTERN = f"^(?:{_DURATION.pattern}|{_SECONDS.pattern})$"  # the same, for the OpenAPI document


def parse_duration(text: str) -> float:
    """Seconds in `text` (negative when it starts with '-'); ValueError for anything else, "" included."""
    if _SECONDS.fullmatch(text):
        return float(text)
    if not _DURATION.fullmatch(text):
        raise ValueError(f"not a duration: {text!r}")
    total = sum(float(number) * UNITS[unit] for number, unit in _TERM.findall(text))
    return -total if text.startswith("-") else total
