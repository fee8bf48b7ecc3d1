"""Queue formulas shared by the server's admission and the fan-out simulator (one source of truth).

  queue cap     QUEUE_PER_SLOT waiting requests per decode slot, unless GMLX_QUEUE_DEPTH_CAP sets it
  drain ETA     pending prefill tokens / prefill rate + pending decode tokens / aggregate decode rate
  Retry-After   the drain ETA rounded up and clamped to 2..60 s
"""

from __future__ import annotations

import math
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
