"""Queue-cap admission: refuse with 503 + Retry-After (the drain estimate) when too many requests wait.

The cap follows the decode width unless GMLX_QUEUE_DEPTH_CAP sets it. The drain estimate is what a
load balancer or client waits before retrying: tokens still to generate over the recent decode rate.
"""

from __future__ import annotations

from gmlx_plan.queueing import Rates, default_queue_cap, drain_by_phases, retry_after_s, step_time
from gmlx_plan.queueing import drain_eta_s as plan_drain_eta_s
from gmlx_server.config import RuntimeEnv
from gmlx_server.engine.types import EngineStats, RequestRow
from gmlx_server.errors import ServerOverloaded
from gmlx_server.service.telemetry import ModelRates, Telemetry

FALLBACK_DECODE_TOK_S = 5.0  # per stream, before any request has finished (CPU-class figure)
FALLBACK_PREFILL_TOK_S = 100.0
FALLBACK_OUTPUT_TOKENS = 256  # expected length of an uncapped answer before any has finished


def queue_cap(env: RuntimeEnv, stats: EngineStats) -> int:
    return env.queue_depth_cap if env.queue_depth_cap is not None else default_queue_cap(stats.decode_batch)


def drain_eta_s(stats: EngineStats, rates: ModelRates | None) -> float:
    """Seconds until the engine has worked off what is running and waiting now. With the engine's measured
    step times, its schedule replayed phase by phase; before any, gmlx_plan's rate formula."""
    expected = (rates.mean_generated if rates else None) or FALLBACK_OUTPUT_TOKENS
    prefill_tok_s = stats.prefill_tok_s or (rates.prefill_tok_s_recent if rates else None) or FALLBACK_PREFILL_TOK_S

    def left(row: RequestRow) -> float:
        return max(min(row.max_tokens, expected) - row.generated, 1.0)

    if stats.step_s:
        decoding = [left(r) for r in stats.rows if r.state == "decode"]
        pending = [(float(r.prompt_tokens - r.warm_tokens), left(r)) for r in stats.rows if r.state != "decode"]
        return drain_by_phases(decoding, pending, stats.decode_batch, step_time(stats.step_s), prefill_tok_s)
    r = Rates((rates.decode_tok_s_recent if rates else None) or FALLBACK_DECODE_TOK_S, prefill_tok_s,
              batch_scaling=1.0)
    decode_left = sum(left(row) for row in stats.rows)
    prefill_left = sum(row.prompt_tokens for row in stats.rows if row.state in ("queued", "prefill"))
    return plan_drain_eta_s(prefill_left, decode_left, len(stats.rows), stats.decode_batch, r)


class Admission:
    def __init__(self, env: RuntimeEnv, telemetry: Telemetry) -> None:
        self.env, self.telemetry = env, telemetry

    def eta_s(self, model_id: str, stats: EngineStats) -> float:
        return drain_eta_s(stats, self.telemetry.models.get(model_id))

    def admit(self, model_id: str, stats: EngineStats) -> None:
        """Raise ServerOverloaded when the queue is at its cap; count the rejection.

        `waiting` counts requests waiting for a decode slot (one queued beside a free slot is in flight), so
        the figure /v1/metrics shows never exceeds the cap.
        """
        cap = queue_cap(self.env, stats)
        free = max(0, stats.decode_batch - stats.in_flight - stats.waiting)
        if stats.waiting + max(0, 1 - free) <= cap:
            return
        retry = retry_after_s(self.eta_s(model_id, stats))
        self.telemetry.record_reject("queue_full")
        raise ServerOverloaded(
            f"server overloaded: {stats.waiting} requests wait for model '{model_id}' (queue cap {cap}, "
            f"{stats.in_flight}/{stats.decode_batch} decoding); retry after {retry} s", retry)
