"""Queue formulas shared by the server's admission and the fan-out simulator (one source of truth).

  queue cap     QUEUE_PER_SLOT waiting requests per decode slot, unless GMLX_QUEUE_DEPTH_CAP sets it
  drain ETA     pending prefill tokens / prefill rate + pending decode tokens / aggregate decode rate, or,
                with a running engine's measured step times, the same work replayed phase by phase
  Retry-After   the drain ETA rounded up and clamped to 2..60 s
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
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


def drain_eta_s(prefill_tokens: float, decode_tokens: float, streams: int, slots: int, rates: Rates) -> float:
    """Seconds to finish the work in the engine now: what queue.eta_s and Retry-After carry."""
    width = max(1, min(slots, streams))
    return prefill_tokens / rates.prefill_tok_s + decode_tokens / rates.aggregate(width)


def retry_after_s(eta_s: float) -> int:
    return int(min(RETRY_MAX_S, max(RETRY_MIN_S, math.ceil(eta_s))))


def step_time(measured: Mapping[int, float]) -> Callable[[int], float]:
    """A decode step's seconds at width k, from the widths measured: the nearest one (ties: the wider)."""
    widths = sorted(measured)

    def at(k: int) -> float:
        return measured[min(widths, key=lambda w: (abs(w - k), -w))]

    return at


def drain_by_phases(decoding: Iterable[float], pending: Iterable[tuple[float, float]], slots: int,
                    step_s: Callable[[int], float], prefill_tok_s: float) -> float:
    """Seconds to finish everything: the `decoding` rows' remaining tokens advance together, a step at width
    k taking step_s(k); each free slot takes the next `pending` (prompt tokens, output tokens), prefilled
    first on the same thread. Replays the engine's schedule one phase (until the next row ends) at a time."""
    active = sorted(decoding)
    queue = deque(pending)
    t = 0.0
    while active or queue:
        while queue and len(active) < max(1, slots):
            prompt, output = queue.popleft()
            t += prompt / prefill_tok_s
            bisect.insort(active, max(1.0, output))
        first = active[0]
        t += first * step_s(len(active))
        active = [a - first for a in active[1:] if a - first > 1e-9]
    return t
