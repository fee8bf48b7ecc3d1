"""Queue-cap admission: refuse with 503 + Retry-After (the drain estimate) when too many requests wait.

The cap follows the decode width unless GMLX_QUEUE_DEPTH_CAP sets it. The drain estimate is what a
load balancer or client waits before retrying: the engine's schedule replayed from what runs and waits
now (gmlx_plan's replay, the simulator's own loop) at the measured paces: cold prompt tokens at the
prefill pace of their depth, warm ones at the restore pace, decode steps at the measured widths.
"""

from __future__ import annotations

from collections.abc import Sequence

from gmlx_plan.pace import Paces, PrefillPace
from gmlx_plan.queueing import default_queue_cap, retry_after_s
from gmlx_plan.simulate import Backlog, Replay, ServerSide, replay
from gmlx_server.config import RuntimeEnv
from gmlx_server.engine.types import EngineStats, RequestRow
from gmlx_server.errors import ServerOverloaded
from gmlx_server.serving.telemetry import ModelRates, Telemetry

FALLBACK_DECODE_TOK_S = 5.0  # per stream, before any request has finished (CPU-class figure)
FALLBACK_PREFILL_TOK_S = 100.0
FALLBACK_OUTPUT_TOKENS = 256  # expected length of an uncapped answer before any has finished


def queue_cap(env: RuntimeEnv, stats: EngineStats) -> int:
    return env.queue_depth_cap if env.queue_depth_cap is not None else default_queue_cap(stats.decode_batch)


def paces_of(stats: EngineStats | None, rates: ModelRates | None) -> Paces:
    """The model's measured paces, each falling back on its own: the prefill pace fitted on computed spans
    (else FALLBACK_PREFILL_TOK_S), the restore pace (else restores are free), the engine's step times by
    width (else one stream's recent decode rate, or FALLBACK_DECODE_TOK_S, at every width)."""
    prefill = (rates.prefill_pace if rates else None) or PrefillPace(1.0 / FALLBACK_PREFILL_TOK_S)
    steps = dict(stats.step_s) if stats is not None and stats.step_s else {
        1: 1.0 / ((rates.decode_tok_s_recent if rates else None) or FALLBACK_DECODE_TOK_S)}
    join = stats.join_s if stats is not None and stats.join_s is not None else 0.0
    leave = stats.leave_s if stats is not None and stats.leave_s is not None else 0.0
    depth = (stats.step_ctx, stats.step_s_per_ctx) if stats is not None else ({}, 0.0)
    return Paces(prefill, steps, rates.restore_tok_s_recent if rates else None, join, "server", *depth, leave)


def backlog_of(stats: EngineStats, rates: ModelRates | None,
               also: Sequence[tuple[int, int, int]] = (), priority: int = 0) -> Backlog:
    """What runs and waits now, each row's output at most the recent mean length. The queue is in the engine's
    order (by priority, lower sooner; then by arrival), and `also` joins it at `priority`: behind every row of
    the same or a sooner priority, ahead of later ones."""
    expected = (rates.mean_generated if rates else None) or FALLBACK_OUTPUT_TOKENS

    def left(row: RequestRow) -> int:
        return max(int(min(row.max_tokens, expected)) - row.generated, 1)

    prefill = next((r for r in stats.rows if r.state == "prefill"), None)
    decoding = [r for r in stats.rows if r.state == "decode"]
    queued = sorted((r for r in stats.rows if r.state == "queued"), key=lambda r: r.priority)
    rows = [(r.priority, (r.prompt_tokens, r.expected_warm, left(r) - 1)) for r in queued]
    return Backlog([float(left(r)) for r in decoding],
                   (prefill.prompt_tokens, prefill.prefilled, left(prefill) - 1) if prefill else None,
                   [*(row for p, row in rows if p <= priority), *also, *(row for p, row in rows if p > priority)],
                   [r.prompt_tokens + r.generated for r in decoding])


def _server(stats: EngineStats) -> ServerSide:
    return ServerSide(stats.decode_batch, queue_cap=0)


def drain_eta_s(stats: EngineStats, rates: ModelRates | None) -> float:
    """Seconds until the engine has worked off what is running and waiting now."""
    return replay(backlog_of(stats, rates), _server(stats), paces_of(stats, rates)).drain_s


def replay_with(stats: EngineStats, rates: ModelRates | None, new: Sequence[tuple[int, int, int]],
                priority: int = 0) -> Replay:
    """The engine's schedule from now with `new` requests (prompt, warm, max_tokens) queued at `priority`: the
    drain, and the first token of each new request."""
    expected = (rates.mean_generated if rates else None) or FALLBACK_OUTPUT_TOKENS
    rows = [(p, min(w, p - 1), max(0, int(min(cap, expected)) - 1)) for p, w, cap in new]
    ahead = sum(r.state == "queued" and r.priority <= priority for r in stats.rows)
    r = replay(backlog_of(stats, rates, rows, priority), _server(stats), paces_of(stats, rates))
    return Replay(r.drain_s, r.first_token_s[ahead: ahead + len(rows)])


def disk_extra_s(rates: ModelRates | None, warm: int) -> float:
    """What reading `warm` tokens from the disk tier adds to restoring them from RAM (the replay's pace for every
    restore); 0 before a disk restore was timed."""
    disk = rates.disk_restore_tok_s_recent if rates is not None else None
    if not disk or warm <= 0:
        return 0.0
    ram = rates.restore_tok_s_recent if rates is not None else None
    return warm / disk - (warm / ram if ram else 0.0)


def ttft_s(stats: EngineStats, rates: ModelRates | None, prompt: int, warm: int, max_tokens: int,
           disk: bool = False, priority: int = 0) -> float:
    """When a request sent now gets its first token: the queue ahead of it (at its priority), then its warm tokens
    restored (read from the disk tier when `disk`) and its cold ones prefilled at their depth, between the
    running rows' steps."""
    (first,) = replay_with(stats, rates, [(prompt, warm, max_tokens)], priority).first_token_s
    return first + (disk_extra_s(rates, min(warm, prompt - 1)) if disk else 0.0)


class Admission:
    def __init__(self, env: RuntimeEnv, telemetry: Telemetry) -> None:
        self.env, self.telemetry = env, telemetry

    def eta_s(self, model_id: str, stats: EngineStats) -> float:
        return drain_eta_s(stats, self.telemetry.models.get(model_id))

    def ttft_s(self, model_id: str, stats: EngineStats, prompt: int, warm: int, max_tokens: int | None,
               disk: bool = False, priority: int = 0) -> float:
        return ttft_s(stats, self.telemetry.models.get(model_id), prompt, warm, max_tokens or FALLBACK_OUTPUT_TOKENS,
                      disk, priority)

    def wave(self, model_id: str, stats: EngineStats, width: int, depth: int) -> Replay:
        """`width` cold requests of `depth` prompt tokens sent now, behind what runs and waits."""
        return replay_with(stats, self.telemetry.models.get(model_id), [(depth, 0, FALLBACK_OUTPUT_TOKENS)] * width)

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
