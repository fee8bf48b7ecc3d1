"""Per-service counters for /v1/metrics and Prometheus: requests by outcome, latency, bytes in and out."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from gmlx_server.serving.telemetry import RECENT, Histogram


@dataclass
class ServiceStats:
    outcomes: Counter[str] = field(default_factory=Counter)  # ok, error (4xx/5xx after admission), rejected
    latency: Histogram = field(default_factory=Histogram)
    recent_s: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))
    bytes_in: int = 0
    bytes_out: int = 0

    def finished(self, seconds: float, ok: bool) -> None:
        self.outcomes["ok" if ok else "error"] += 1
        self.latency.observe(seconds)
        if ok:
            self.recent_s.append(seconds)

    @property
    def mean_s(self) -> float | None:
        return sum(self.recent_s) / len(self.recent_s) if self.recent_s else None

    def section(self) -> dict[str, Any]:
        mean = self.mean_s
        return {"requests": sum(self.outcomes.values()), "errors": self.outcomes["error"],
                "rejections": self.outcomes["rejected"], "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
                "latency_s_recent": round(mean, 4) if mean is not None else None,
                "latency_s_sum": round(self.latency.total, 4), "latency_count": self.latency.count,
                # cumulative counts per upper bound, as Prometheus histograms take them
                "latency_buckets": [["+Inf" if b == float("inf") else b, n] for b, n in self.latency.cumulative()]}
