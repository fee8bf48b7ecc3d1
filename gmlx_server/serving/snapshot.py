"""The /v1/metrics snapshot: independent sections, each probed on its own.

A section whose probe raises keeps its keys with null live values, and the rest still answers.
Engine rows are cached for 250 ms per engine (at most four refreshes a second), and nothing here
waits on an engine thread: stats() is a locked copy of plain attributes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from gmlx_plan.pace import prefill_json
from gmlx_server.engine.types import Engine, EngineStats, ModelInfo, RequestRow, SpeculativeStats
from gmlx_server.serving.admission import Admission, queue_cap
from gmlx_server.serving.cache_stats import cache_brief
from gmlx_server.serving.governor import BANDS, Governor
from gmlx_server.serving.telemetry import ModelRates, Telemetry

ROW_REFRESH_S = 0.25
log = logging.getLogger("gmlx.metrics")

SECTION_KEYS: dict[str, tuple[str, ...]] = {
    "concurrency": ("decode_batch", "queue_cap", "in_flight", "waiting"),
    "queue": ("waiting", "cap", "eta_s", "rejections", "last_reject_reason"),
    "governor": ("band", "enabled", "band_changes", "sheds"),
    "memory": ("active_bytes", "cache_bytes", "headroom_bytes", "rss_bytes", "budget_bytes",
               "arena_bytes", "arena_capacity_bytes", "arena_hit_rate"),
    "rates": ("decode_tok_s", "decode_streams", "prefill_tok_s_recent", "restore_tok_s_recent",
              "decode_tok_s_recent", "decode_tok_s_lifetime", "by_model"),
    "tool_calls": ("parsed", "constrained", "failed", "by_model"),
    "tokens": ("prompt", "generated", "reasoning", "by_model"),
}


class StatsCache:
    """engine.stats() at most every ROW_REFRESH_S per engine."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cache: dict[str, tuple[float, EngineStats]] = {}

    def get(self, model_id: str, engine: Engine) -> EngineStats:
        now = self._clock()
        hit = self._cache.get(model_id)
        if hit is None or now - hit[0] >= ROW_REFRESH_S:
            hit = (now, engine.stats())
            self._cache[model_id] = hit
        return hit[1]


class Snapshotter:
    def __init__(self, engines: Callable[[], Mapping[str, Engine]], telemetry: Telemetry, admission: Admission,
                 governor: Governor, decode_batch: int, capacity: Callable[[], dict[str, Any] | None],
                 entries: Callable[[str], Any], marks: Callable[[str], Mapping[str, object]] | None = None,
                 extra: Mapping[str, Callable[[], Any]] | None = None) -> None:
        self._engines, self.telemetry, self.admission, self.governor = engines, telemetry, admission, governor
        self.decode_batch, self._capacity, self._entry = decode_batch, capacity, entries
        self._marks = marks  # pinned, kept and load count per resident model (the host's residency)
        self.stats = StatsCache()
        self._extra = dict(extra or {})  # more sections, each probed like the rest (the services)

    def snapshot(self) -> dict[str, Any]:
        engines = dict(self._engines())
        stats = {m: self.stats.get(m, e) for m, e in engines.items()}
        builders: dict[str, Callable[[], Any]] = {
            "concurrency": lambda: self._concurrency(stats),
            "queue": lambda: self._queue(stats),
            "requests": lambda: _requests(stats, self.telemetry.assistant_steps, self.telemetry.callers,
                                          self.telemetry.models),
            "resident_models": lambda: self._resident(engines, stats),
            "governor": self._governor,
            "memory": self._memory,
            "capacity": self._capacity,
            "rates": lambda: self._rates(stats),
            "tool_calls": self._tool_calls,
            "tokens": self._tokens,
            **self._extra,
        }
        return {"server": {name: self._probe(name, fn) for name, fn in builders.items()}}

    def _probe(self, name: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception:  # one failing probe nulls its own section only
            log.exception("metrics probe %s failed", name)
            keys = SECTION_KEYS.get(name)
            return dict.fromkeys(keys) if keys else ([] if name in ("requests", "resident_models") else None)

    def _concurrency(self, stats: Mapping[str, EngineStats]) -> dict[str, Any]:
        return {"decode_batch": self.decode_batch, "queue_cap": self._cap(stats),
                "in_flight": sum(s.in_flight for s in stats.values()),
                "waiting": sum(s.waiting for s in stats.values())}

    def _cap(self, stats: Mapping[str, EngineStats]) -> int:
        return queue_cap(self.admission.env, EngineStats(self.decode_batch, 0, 0)) if not stats else max(
            queue_cap(self.admission.env, s) for s in stats.values())

    def _queue(self, stats: Mapping[str, EngineStats]) -> dict[str, Any]:
        etas = [self.admission.eta_s(m, s) for m, s in stats.items()]
        t = self.telemetry
        return {"waiting": sum(s.waiting for s in stats.values()), "cap": self._cap(stats),
                "eta_s": round(max(etas), 2) if etas else 0.0, "rejections": sum(t.rejections.values()),
                "last_reject_reason": t.last_reject_reason}

    def _resident(self, engines: Mapping[str, Engine], stats: Mapping[str, EngineStats]) -> list[dict[str, Any]]:
        out = []
        for m, e in engines.items():
            entry = self._entry(m)
            mem = e.memory
            marks = self._marks(m) if self._marks else {"pinned": bool(entry and entry.pinned), "kept": False}
            out.append({"id": m, "in_flight": stats[m].in_flight, "waiting": stats[m].waiting,
                        "decode_batch": stats[m].decode_batch, "kv_cache_usage": kv_usage(stats[m], e.info),
                        **marks, "profile": entry.profile if entry else None,
                        "weights_bytes": e.info.weights_bytes, "weights_layout": e.info.weights_layout,
                        "active_bytes": mem.active_bytes if mem else None, "load_s": round(e.info.load_s, 3),
                        "speculative": self._drafting(m, e), "prompt_cache": cache_brief(e)})
        return out

    def _drafting(self, model_id: str, engine: Engine) -> dict[str, Any] | None:
        """A speculative model's finished requests' drafting (zeros before the first); None without a drafter."""
        if not engine.info.drafts:
            return None
        rates = self.telemetry.models.get(model_id)
        return speculative_json((rates.speculative if rates else None) or SpeculativeStats())

    def _governor(self) -> dict[str, Any]:
        g = self.governor
        return {"band": g.band, "enabled": g.enabled,
                "band_changes": {b: g.band_changes.get(b, 0) for b in BANDS}, "sheds": g.sheds}

    def _memory(self) -> dict[str, Any]:
        r = self.governor.read()  # fresh: the snapshot must not show a stale or missing reading
        return {"active_bytes": r.mlx_active_bytes, "cache_bytes": r.mlx_cache_bytes,
                "headroom_bytes": r.available_bytes, "rss_bytes": r.rss_bytes, "budget_bytes": r.total_bytes,
                # Streamed-weights arenas are not built: present and null.
                "arena_bytes": None, "arena_capacity_bytes": None, "arena_hit_rate": None}

    def _rates(self, stats: Mapping[str, EngineStats]) -> dict[str, Any]:
        live = [r.decode_tok_s for s in stats.values() for r in s.rows if r.state == "decode" and r.decode_tok_s]
        models = list(self.telemetry.models.values())

        def mean(values: list[float | None]) -> float | None:
            vals = [v for v in values if v is not None]
            return round(sum(vals) / len(vals), 3) if vals else None

        return {"decode_tok_s": round(sum(live), 3), "decode_streams": len(live),
                "prefill_tok_s_recent": mean([m.prefill_tok_s_recent for m in models]),
                "restore_tok_s_recent": mean([m.restore_tok_s_recent for m in models]),
                "decode_tok_s_recent": mean([m.decode_tok_s_recent for m in models]),
                "decode_tok_s_lifetime": mean([m.decode_tok_s_lifetime for m in models]),
                "by_model": {m: measured_paces(self.telemetry.models.get(m), stats.get(m))
                             for m in sorted({*self.telemetry.models, *stats})}}


    def _tool_calls(self) -> dict[str, Any]:
        """Calls parsed from replies, those of them decoded under a call grammar, and opened calls that failed."""
        by_model = {m: dict(r.tool_calls) for m, r in self.telemetry.models.items() if r.tool_calls}
        totals = {k: sum(c.get(k, 0) for c in by_model.values()) for k in ("parsed", "constrained", "failed")}
        return {**totals, "by_model": by_model}

    def _tokens(self) -> dict[str, Any]:
        """Finished requests' prompt and generated tokens, and the generated ones spent in thinking blocks."""
        by_model = {m: {"prompt": r.prompt_tokens, "generated": r.generated_tokens, "reasoning": r.reasoning_tokens}
                    for m, r in sorted(self.telemetry.models.items())}
        totals = {k: sum(c[k] for c in by_model.values()) for k in ("prompt", "generated", "reasoning")}
        return {**totals, "by_model": by_model}


def measured_paces(rates: ModelRates | None, stats: EngineStats | None) -> dict[str, Any]:
    """One model's measured paces (null until measured), in gmlx_plan's Paces JSON: what `gmlx plan simulate
    --server` reads, and what the server's own estimates compute with."""
    return {"prefill_tok_s": _round(rates.prefill_tok_s_recent if rates else None),
            **prefill_json(rates.prefill_pace if rates else None),
            "restore_tok_s": _round(rates.restore_tok_s_recent if rates else None),
            "disk_restore_tok_s": _round(rates.disk_restore_tok_s_recent if rates else None),
            "decode_join_s": stats.join_s if stats else None,
            "decode_leave_s": stats.leave_s if stats else None,
            "decode_step_s": {str(w): s for w, s in sorted(stats.step_s.items())} if stats else {},
            "decode_step_ctx": {str(w): c for w, c in sorted(stats.step_ctx.items())} if stats else {},
            "decode_step_s_per_ctx": stats.step_s_per_ctx if stats else None}


def kv_usage(stats: EngineStats, info: ModelInfo) -> float:
    """The share of a model's KV budget (every decode slot at its full context) that its live rows hold now:
    prompt tokens prefilled so far, plus the tokens generated once decoding."""
    held = sum(r.prefilled if r.state == "prefill" else r.prompt_tokens + r.generated
               for r in stats.rows if r.state in ("prefill", "decode"))
    budget = stats.decode_batch * info.context_length
    return round(min(1.0, held / budget), 6) if budget > 0 else 0.0


def _round(v: float | None) -> float | None:
    return round(v, 3) if v is not None else None


def _requests(stats: Mapping[str, EngineStats], steps: Mapping[str, Any], callers: Mapping[str, str],
              rates: Mapping[str, ModelRates]) -> list[dict[str, Any]]:
    rows = [(m, r) for m, s in stats.items() for r in s.rows]
    rows.sort(key=lambda mr: mr[1].state != "queued")  # queued rows first
    position: dict[str, int] = {}
    out = []
    for m, r in rows:
        pos = None
        if r.state == "queued":
            pos = position[m] = position.get(m, 0) + 1
        elif r.state == "prefill":
            pos = r.prefilled  # prompt tokens in the cache so far, refreshed per chunk
        out.append({"id": r.request_id, "model": m, "key": callers.get(r.request_id), "priority": r.priority,
                    "state": r.state, "position": pos, "prefill_eta_s": prefill_eta(r, rates.get(m)),
                    "prompt_tokens": r.prompt_tokens, "generated": r.generated, "max_tokens": r.max_tokens,
                    "elapsed_s": round(r.elapsed_s, 3),
                    "ttft_s": round(r.ttft_s, 3) if r.ttft_s is not None else None,
                    "decode_tok_s": round(r.decode_tok_s, 2) if r.decode_tok_s is not None else None,
                    "cache": {"tier": r.cache_tier, "warm_tokens": r.warm_tokens},
                    "speculative": speculative_json(r.speculative),
                    "assistant": steps.get(r.request_id)})  # an assistant's loop: its id and step, else null
    return out


def prefill_eta(r: RequestRow, rates: ModelRates | None) -> float | None:
    """Seconds left of a prefilling row's prompt: at the model's measured prefill pace (its depth slope included),
    else at the pace this row has kept so far; None for other rows, or before either is known."""
    if r.state != "prefill" or r.prefilled >= r.prompt_tokens:
        return None
    pace = rates.prefill_pace if rates is not None else None
    if pace is not None:
        return round(pace.seconds(r.prefilled, r.prompt_tokens), 1)
    computed = r.prefilled - r.warm_tokens
    return round(r.elapsed_s * (r.prompt_tokens - r.prefilled) / computed, 1) if computed > 0 else None


def speculative_json(s: SpeculativeStats | None) -> dict[str, Any] | None:
    """A drafter's counts and accept rate (accepted / drafted); None without a drafter."""
    if s is None:
        return None
    rate = s.accept_rate
    return {"rounds": s.rounds, "drafted": s.drafted, "accepted": s.accepted,
            "accept_rate": round(rate, 4) if rate is not None else None}
