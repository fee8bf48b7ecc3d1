"""Request telemetry: recent and lifetime rates per model, latency histograms, rejections and sheds.

Fed by the generation service as requests finish; read by /v1/metrics (JSON and Prometheus) and by
admission's drain estimate. Plain Python, updated on the event loop only.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from gmlx_plan.pace import PrefillPace, Span, fit_prefill
from gmlx_server.engine.types import RequestHandle, SpeculativeStats, Timings, TokenEvent
from gmlx_server.serving.key_meter import KeyMeter

RECENT = 8  # "recent" figures (/v1/metrics, gmlx top) cover the last eight requests
PACE_SPANS = 64  # computed prompt spans (chunks) the prefill pace is fitted on
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        i = next((k for k, b in enumerate(self.buckets) if value <= b), len(self.buckets))
        self.counts[i] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, cumulative count) pairs ending with +Inf, as Prometheus wants them."""
        out, run = [], 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            run += n
            out.append((bound, run))
        return out


@dataclass
class ModelRates:
    # (tokens, seconds) per request: its computed prompt tokens, and apart from them its restored ones
    recent_prefill: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=RECENT))
    recent_restore: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=RECENT))
    recent_disk_restore: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=RECENT))
    spans: deque[Span] = field(default_factory=lambda: deque(maxlen=PACE_SPANS))
    recent_decode: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))
    recent_generated: deque[int] = field(default_factory=lambda: deque(maxlen=RECENT))
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    finished: Counter[str] = field(default_factory=Counter)
    speculative: SpeculativeStats | None = None  # finished requests' drafting; None until one drafted
    tool_calls: Counter[str] = field(default_factory=Counter)  # parsed, constrained (of those), failed
    reasoning_tokens: int = 0  # generated tokens spent in thinking blocks (of generated_tokens)

    @staticmethod
    def _mean(values: deque[float] | deque[int]) -> float | None:
        return sum(values) / len(values) if values else None

    @staticmethod
    def _pace(pairs: deque[tuple[int, float]]) -> float | None:
        seconds = sum(s for _, s in pairs)
        return sum(n for n, _ in pairs) / seconds if seconds > 0 else None

    @property
    def prefill_tok_s_recent(self) -> float | None:
        """Prompt tokens run through the model over the seconds they took (cache hits' reused tokens aside)."""
        return self._pace(self.recent_prefill)

    @property
    def restore_tok_s_recent(self) -> float | None:
        """Prompt tokens restored from the prompt cache over the seconds the restores took."""
        return self._pace(self.recent_restore)

    @property
    def disk_restore_tok_s_recent(self) -> float | None:
        """Prompt tokens restored from the disk tier over the seconds those restores took (a file read each)."""
        return self._pace(self.recent_disk_restore)

    @property
    def prefill_pace(self) -> PrefillPace | None:
        """The depth-aware prefill pace fitted on the recent computed spans."""
        return fit_prefill(self.spans)

    @property
    def decode_tok_s_recent(self) -> float | None:
        return self._mean(self.recent_decode)

    @property
    def decode_tok_s_lifetime(self) -> float | None:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else None

    @property
    def mean_generated(self) -> float | None:
        return self._mean(self.recent_generated)


class Telemetry:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.models: dict[str, ModelRates] = {}
        self.ttft = Histogram()
        self.latency = Histogram()
        self.rejections: Counter[str] = Counter()
        self.last_reject_reason: str | None = None
        self.sheds = 0
        self.ignored_fields: Counter[str] = Counter()  # request fields gmlx ignored, by name (serving/ignored_fields)
        self.assistant_steps: dict[str, dict[str, Any]] = {}  # request id -> its assistant loop's step (rows)
        self.keys = KeyMeter()  # per key name: requests, refusals, tokens
        self.callers: dict[str, str] = {}  # live request id -> its caller's key name (request rows show it)

    def model(self, model_id: str) -> ModelRates:
        return self.models.setdefault(model_id, ModelRates())

    def record_reject(self, reason: str) -> None:
        self.rejections[reason] += 1
        self.last_reject_reason = reason

    def record_tools(self, model_id: str, parsed: int, failed: int, constrained: bool) -> None:
        """One reply's tool calls: parsed, parsed from constrained output, and opened calls that did not parse."""
        calls = self.model(model_id).tool_calls
        calls.update({"parsed": parsed, "constrained": parsed if constrained else 0, "failed": failed})

    def record_reasoning(self, model_id: str, tokens: int) -> None:
        """One reply's tokens inside its thinking block, read apart from its answer."""
        self.model(model_id).reasoning_tokens += tokens

    def record_final(self, model_id: str, event: TokenEvent, started: float) -> None:
        m = self.model(model_id)
        m.finished[event.finish_reason or "unknown"] += 1
        self.latency.observe(self.clock() - started)
        if event.finish_reason == "shed":
            self.sheds += 1
        t = event.timings
        if t is None:
            return
        m.prompt_tokens += t.prompt_tokens
        m.generated_tokens += t.generated
        if t.speculative is not None:
            m.speculative = (m.speculative or SpeculativeStats()) + t.speculative
        if t.ttft_s is not None:
            self.ttft.observe(t.ttft_s)
        self._prompt_work(m, t)
        if t.generated > 1 and t.decode_s > 0:
            m.recent_decode.append(t.decode_tok_s)
            m.decode_tokens += t.generated - 1
            m.decode_seconds += t.decode_s
        m.recent_generated.append(t.generated)

    @staticmethod
    def _prompt_work(m: ModelRates, t: Timings) -> None:
        if t.computed_s > 0:
            m.recent_prefill.append((t.computed_tokens, t.computed_s))
            m.spans.extend(t.spans)
        if t.cached_tokens and t.restore_s > 0:  # a disk read has its own pace
            (m.recent_disk_restore if t.cache_tier == "disk" else m.recent_restore).append((t.cached_tokens,
                                                                                            t.restore_s))

    def track(self, model_id: str, handle: RequestHandle,
              also: Callable[[TokenEvent], None] | None = None) -> RequestHandle:
        """Wrap a handle so its final event is recorded (and handed to `also`), whoever iterates it."""
        def on_final(ev: TokenEvent, t0: float) -> None:
            self.record_final(model_id, ev, t0)
            if also is not None:
                also(ev)

        return _Tracked(handle, on_final, self.clock())


class _Tracked:
    """A handle whose final event is recorded once: a cancelled request's too, read after its reader left."""

    def __init__(self, inner: RequestHandle, on_final: Callable[[TokenEvent, float], None], started: float) -> None:
        self.request_id = inner.request_id
        self._inner, self._on_final, self._started = inner, on_final, started
        self._final = False
        self._drain: asyncio.Task[None] | None = None

    def cancel(self) -> None:
        self._inner.cancel()
        if not self._final and self._drain is None:
            self._drain = asyncio.get_running_loop().create_task(self._read_final())

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[TokenEvent]:
        async for ev in self._inner:
            self._seen(ev)
            yield ev

    def _seen(self, ev: TokenEvent) -> None:
        if ev.finish_reason is not None and not self._final:
            self._final = True
            self._on_final(ev, self._started)

    async def _read_final(self) -> None:
        """The engine still ends a cancelled request with a final event (its tokens, TTFT): read it. The
        reader that left took nothing more (a cancelled queue get leaves its item in the queue)."""
        async for ev in self._inner:
            self._seen(ev)
