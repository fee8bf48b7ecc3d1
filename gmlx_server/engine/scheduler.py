"""The engine thread's loop: admit queued requests, prefill one chunk, decode one batched step, repeat.

One prefill chunk between decode steps keeps running streams decoding while a long prompt loads.
"""

from __future__ import annotations

import logging
import queue
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from gmlx_plan.pace import PrefillPace, Span, fit_prefill, fit_step_depth
from gmlx_plan.queueing import step_time
from gmlx_server.engine.batch import BatchDecoder
from gmlx_server.engine.cache_tiers import CacheTiers
from gmlx_server.engine.kernels.fast_ops import MLX_OPS, Primitives
from gmlx_server.engine.request_run import GrammarTokenizer, Progress, RequestRun
from gmlx_server.engine.spec_round import Speculator
from gmlx_server.engine.types import GenerationRequest, MemorySnapshot, SpeculativeStats, TokenEvent
from gmlx_server.engine.vision.prefill import VisionRuntime

log = logging.getLogger("gmlx.engine")
PACE_WINDOW = 32  # steps per width the measured decode pace looks back on
MAX_REWINDS = 3  # a row recomputed this often after failed steps fails itself: no endless recovery loop


@dataclass
class Job:
    request: GenerationRequest
    emit: Callable[[TokenEvent], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    progress: Progress = field(default_factory=Progress)
    shed_reason: str | None = None  # set by another thread; the engine thread ends the request with "shed"
    expected_warm: int | None = None  # while queued: the warm tokens its prefill should start from (stats())


class Pace:
    """A decode step's seconds by batch width, kept by the engine thread: the median of the recent steps, so
    one stall on a shared machine does not swing it. The prefill and restore paces come with each request's
    Timings (its computed spans), which the service's telemetry fits; the engine keeps the recent spans too,
    for the disk tier's choice between a restore and a prefill."""

    def __init__(self) -> None:
        self._steps: dict[int, deque[tuple[float, int]]] = {}  # by width: (seconds, the batch's KV tokens)
        self._joins: deque[tuple[int, float]] = deque(maxlen=PACE_WINDOW)
        self._leaves: deque[tuple[int, float]] = deque(maxlen=PACE_WINDOW)
        self._spans: deque[Span] = deque(maxlen=PACE_WINDOW)

    def prefilled(self, spans: Iterable[Span]) -> None:
        """A request's prefill ended: its computed spans."""
        self._spans.extend(spans)

    @property
    def prefill(self) -> PrefillPace | None:
        return fit_prefill(list(self._spans))

    def stepped(self, width: int, seconds: float, joined: bool = False, ctx: int = 0, left: bool = False) -> None:
        """A step's seconds; the first step after a row joined pays for merging its cache, and the first after a
        row left for filtering the batch's caches: each kept apart, so the plain medians are plain steps."""
        if joined:
            self._joins.append((width, seconds))
        elif left:
            self._leaves.append((width, seconds))
        else:
            self._steps.setdefault(width, deque(maxlen=PACE_WINDOW)).append((seconds, ctx))

    def _samples(self) -> dict[int, list[tuple[float, int]]]:
        return {w: list(d) for w, d in list(self._steps.items()) if d}

    @property
    def step_s(self) -> dict[int, float]:
        return {w: statistics.median(s for s, _ in d) for w, d in self._samples().items()}

    @property
    def step_ctx(self) -> dict[int, float]:
        """The batch's KV tokens the medians were measured at (their median)."""
        return {w: float(statistics.median(c for _, c in d)) for w, d in self._samples().items()}

    @property
    def step_s_per_ctx(self) -> float:
        return fit_step_depth(self._samples())

    @property
    def join_s(self) -> float | None:
        """What a join adds to the step after it: the median excess over a plain step at that width."""
        return self._excess(self._joins)

    @property
    def leave_s(self) -> float | None:
        """What a row leaving adds to the step after it, likewise."""
        return self._excess(self._leaves)

    def _excess(self, samples: deque[tuple[int, float]]) -> float | None:
        steps = self.step_s
        if not steps:
            return None
        plain = step_time(steps)  # a width with no plain step of its own: between its measured neighbours
        excess = [s - plain(w) for w, s in list(samples)]
        return max(0.0, statistics.median(excess)) if excess else None


Control = Callable[[], None]  # work another thread asks the engine thread to do (e.g. reset the prompt cache)
Inbox = queue.Queue[Job | Control | None]


class Scheduler:
    def __init__(self, model: Any, tokenizer: Any, width: int, inbox: Inbox,
                 forget: Callable[[Job], None], memory: MemorySnapshot,
                 grammar_tokenizer: GrammarTokenizer | None = None, prompt_cache: CacheTiers | None = None,
                 pace: Pace | None = None, caches: Callable[[], list[Any]] | None = None,
                 speculator: Speculator | None = None, vision: VisionRuntime | None = None,
                 prims: Primitives = MLX_OPS) -> None:
        self.model, self.tokenizer, self.width, self.caches, self.vision = model, tokenizer, width, caches, vision
        self.grammar_tokenizer, self.prompt_cache = grammar_tokenizer, prompt_cache
        self.inbox, self.forget, self.memory = inbox, forget, memory
        self.pace = pace if pace is not None else Pace()
        self._joined = False  # a row joined the batch since the last decode step
        self._left = False  # a row left the batch at the last decode step: the next one filters its caches
        self.waiting: deque[Job] = deque()
        self.resuming: deque[tuple[Job, RequestRun]] = deque()  # rows rewound after a failed batched step
        self.prefilling: tuple[Job, RequestRun] | None = None
        self.speculator, self.prims = speculator, prims
        self.batch = BatchDecoder(model, speculator, prims)
        self._jobs: dict[int, Job] = {}  # id(RequestRun) -> its job, to forget finished rows

    def run(self) -> None:
        while self._admit():
            try:
                self._iterate()
            except Exception as e:  # a failure no stage caught: end what this loop holds, keep serving
                log.exception("engine loop iteration failed; failing %d requests and carrying on", self._held())
                self.reset(f"engine error: {type(e).__name__}: {e}")
        self._shutdown()

    def _iterate(self) -> None:
        self._drop_cancelled_waiting()
        self._start_prefill()
        self._prefill_chunk()
        self._decode_step()
        self._measure()

    def _held(self) -> int:
        return len(self.waiting) + len(self.resuming) + (self.prefilling is not None) + len(self.batch)

    def reset(self, error: str) -> None:
        """End every request this loop holds with `error` and start from an empty batch."""
        jobs = [*self.waiting, *(j for j, _ in self.resuming), *([self.prefilling[0]] if self.prefilling else []),
                *(self._jobs[id(s)] for s in self.batch.rows if id(s) in self._jobs)]
        self.waiting.clear()
        self.resuming.clear()
        self.prefilling = None
        self.batch = BatchDecoder(self.model, self.speculator, self.prims)
        self._jobs.clear()
        for job in jobs:
            self._fail(job, error)

    def _measure(self) -> None:
        m = self.memory
        m.active_bytes, m.cache_bytes, m.peak_bytes = (
            mx.get_active_memory(), mx.get_cache_memory(), mx.get_peak_memory())

    def _admit(self) -> bool:
        """Move new jobs to `waiting`; block only when there is nothing else to do. False on shutdown."""
        idle = not (self.waiting or self.resuming or self.prefilling or len(self.batch))
        try:
            item = self.inbox.get() if idle else self.inbox.get_nowait()
            while True:
                if item is None:
                    return False
                if isinstance(item, Job):
                    self._enqueue(item)
                else:
                    self._control(item)
                item = self.inbox.get_nowait()
        except queue.Empty:
            return True

    def _enqueue(self, job: Job) -> None:
        """Behind every waiting job of the same or a sooner priority, ahead of later ones."""
        at = len(self.waiting)
        while at > 0 and self.waiting[at - 1].request.priority > job.request.priority:
            at -= 1
        self.waiting.insert(at, job)

    @staticmethod
    def _control(work: Control) -> None:
        try:
            work()
        except Exception:  # e.g. a cache reset: its failure is logged, the loop goes on
            log.exception("engine control task failed")

    def _fail(self, job: Job, error: str) -> None:
        """End a job that has no live RequestRun with an error event."""
        self.forget(job)
        job.emit(TokenEvent("", None, finish_reason="error", error=error))

    def _drop_cancelled_waiting(self) -> None:
        for job in [j for j in self.waiting if j.cancelled.is_set()]:
            self.waiting.remove(job)
            self.forget(job)
            job.emit(TokenEvent("", None, finish_reason="cancelled"))

    def _start_prefill(self) -> None:
        if self.prefilling is not None or len(self.batch) >= self.width:
            return
        if self.resuming:
            self.prefilling = self.resuming.popleft()
        elif self.waiting:
            job = self.waiting.popleft()
            if self.speculator is not None:
                job.progress.speculative = SpeculativeStats()  # rows of a speculative model show their rounds
            try:
                seq = RequestRun(self.model, self.tokenizer, job.request, job.emit, job.cancelled.is_set,
                               job.progress, grammar_tokenizer=self.grammar_tokenizer, prompt_cache=self.prompt_cache,
                               caches=self.caches, vision=self.vision)
            except Exception as e:  # a request the engine cannot even set up ends alone
                log.exception("request %s could not start", job.request.request_id)
                self._fail(job, f"{type(e).__name__}: {e}")
                return
            self.prefilling = (job, seq)

    def _prefill_chunk(self) -> None:
        if self.prefilling is None:
            return
        job, seq = self.prefilling
        if not seq.prefilled:
            try:
                done = seq.finish("shed", error=job.shed_reason) if job.shed_reason else seq.prefill_step()
            except Exception as e:  # one request's failure must not take the engine down
                log.exception("prefill of %s failed", job.request.request_id)
                done = seq.finish("error", error=f"{type(e).__name__}: {e}")
            if done or seq.prefilled:
                self.pace.prefilled(seq.spans)
            if done:
                self.prefilling = None
                self.forget(job)
                return
        if seq.prefilled and self.batch.settled:  # else it joins after the step queued ahead has run
            self.prefilling = None
            self._join(job, seq)
            self._joined = True

    def _join(self, job: Job, seq: RequestRun) -> None:
        try:
            self.batch.add(seq)
        except Exception as e:  # this row's cache would not merge: it fails, and the batch it touched recomputes
            log.exception("request %s could not join the batch", job.request.request_id)
            seq.finish("error", error=f"{type(e).__name__}: {e}")
            self.forget(job)
            self._recover(self.batch.take_all(), "", blame=False)
            return
        self._jobs[id(seq)] = job

    def _decode_step(self) -> None:
        if not len(self.batch):
            return
        before = list(self.batch.rows)
        try:
            for i, seq in reversed(list(enumerate(self.batch.rows))):
                reason = self._jobs[id(seq)].shed_reason
                if reason is not None:
                    self.batch.shed(i, reason)
            self.batch.cancel_requested()
            if width := len(self.batch):
                left = self._left or width < len(before)  # rows cancelled or shed just now leave in this step
                ctx = sum(len(s.req.prompt_tokens) + len(s.output) for s in self.batch.rows)
                t0 = time.perf_counter()
                self.batch.step(ahead=not (self.waiting or self.resuming or self.prefilling))
                # per token: a speculative round's several tokens must not read as one slow step
                seconds = (time.perf_counter() - t0) / self.batch.last_tokens
                self.pace.stepped(width, seconds, self._joined, ctx, left)
                self._joined, self._left = False, 0 < len(self.batch) < width
        except Exception as e:
            log.exception("decode step failed for %d rows; recomputing them", len(self.batch))
            self._recover(self.batch.take_all(), f"{type(e).__name__}: {e}")
        else:
            for seq in self.batch.rows:
                seq.probation = False  # it decoded in a batch that worked
        for seq in before:
            job = self._jobs.pop(id(seq), None) if seq not in self.batch.rows else None
            if job is not None:
                self.forget(job)

    def _recover(self, rows: list[RequestRun], error: str, blame: bool = True) -> None:
        """After a failed batched step, every row prefills its prompt and output again and rejoins one at a
        time. A row on probation (rejoined since the last good step) that was alone on it is to blame."""
        suspects = [s for s in rows if s.probation] if blame else []
        for seq in rows:
            if (len(suspects) == 1 and seq is suspects[0]) or seq.rewinds >= MAX_REWINDS:
                seq.finish("error", error=f"decode step failed: {error}")
                continue
            seq.rewind()
            self.resuming.append((self._jobs.pop(id(seq)), seq))

    def _shutdown(self) -> None:
        for job in self.waiting:
            job.emit(TokenEvent("", None, finish_reason="cancelled"))
        for _, seq in [*self.resuming, *([self.prefilling] if self.prefilling else [])]:
            seq.finish("cancelled")
        for seq in list(self.batch.rows):
            seq.finish("cancelled")
