"""Queue formulas shared by the server's admission and the fan-out simulator (one source of truth).

  queue cap     QUEUE_PER_SLOT waiting requests per decode slot, unless GMLX_QUEUE_DEPTH_CAP sets it
  Retry-After   the drain ETA (gmlx_plan/simulate.py's replay of the engine loop) rounded up, clamped to 2..60 s
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

RETRY_MIN_S, RETRY_MAX_S = 2, 60
QUEUE_PER_SLOT = 2


@dataclass(frozen=True)
class Rates:
    decode_tok_s: float  # one stream at width 1
    prefill_tok_s: float
    batch_scaling: float = 0.9  # aggregate = decode_tok_s * width ** batch_scaling (1 = perfect batching)

    def aggregate(self, width: int) -> float:
        return float(self.decode_tok_s * math.pow(max(1, width), self.batch_scaling))

    def step_s(self, width: int) -> float:
        return max(1, width) / self.aggregate(width)


def default_queue_cap(decode_batch: int) -> int:
    return QUEUE_PER_SLOT * max(1, decode_batch)


def retry_after_s(eta_s: float) -> int:
    return int(min(RETRY_MAX_S, max(RETRY_MIN_S, math.ceil(eta_s))))


def step_time(measured: Mapping[int, float]) -> Callable[[int], float]:
    """A decode step's seconds at width k, from the widths measured: linear between the measured widths around
    k, the nearest one outside them (a step grows with its rows, but not beyond what was seen)."""
    widths = sorted(measured)

    def at(k: float) -> float:
        below = [w for w in widths if w <= k]
        above = [w for w in widths if w >= k]
        if not below or not above:
            return measured[widths[0] if not below else widths[-1]]
        lo, hi = below[-1], above[0]
        if lo == hi:
            return measured[lo]
        return measured[lo] + (measured[hi] - measured[lo]) * (k - lo) / (hi - lo)

    return at
