"""Tool calls per assistant and tool: count by outcome and latency, for /v1/metrics and Prometheus.

A call to a tool outside the allowlist is counted under NOT_ALLOWED, not under the name the model wrote:
model output must not mint label values.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gmlx_server.serving.telemetry import Histogram

NOT_ALLOWED = "(not allowed)"


@dataclass
class ToolStats:
    outcomes: Counter[str] = field(default_factory=Counter)
    latency: Histogram = field(default_factory=Histogram)

    def json(self) -> dict[str, Any]:
        calls = sum(self.outcomes.values())
        buckets = [["+Inf" if b == float("inf") else b, n] for b, n in self.latency.cumulative()]
        return {"calls": calls, "errors": calls - self.outcomes["ok"], "outcomes": dict(self.outcomes),
                "latency_s_sum": round(self.latency.total, 6), "latency_buckets": buckets}


class ToolMetrics:
    def __init__(self) -> None:
        self.tools: dict[str, dict[str, ToolStats]] = {}  # assistant -> tool -> stats

    def record(self, assistant: str, tool: str | None, outcome: str, seconds: float) -> None:
        """`tool` None: a call outside the allowlist (sent nowhere)."""
        stats = self.tools.setdefault(assistant, {}).setdefault(tool if tool is not None else NOT_ALLOWED,
                                                                ToolStats())
        stats.outcomes[outcome] += 1
        stats.latency.observe(seconds)

    def json(self, assistant: str, allowed: tuple[str, ...] = ()) -> dict[str, Any]:
        """Per tool: every allowed one (zeros before its first call), then any other that was called."""
        seen = self.tools.get(assistant, {})
        return {tool: seen.get(tool, ToolStats()).json() for tool in (*allowed, *(t for t in seen if t not in allowed))}
