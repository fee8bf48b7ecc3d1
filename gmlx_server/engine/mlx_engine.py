"""One engine per resident model: a thread of its own does every MLX call (MLX streams are thread-local).

Requests arrive on a queue; token events go back to the submitting event loop with
`call_soon_threadsafe`, so the asyncio side never touches MLX.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from gmlx_server.engine.arch import vocab_size
from gmlx_server.engine.base import EngineBase
from gmlx_server.engine.cache_tiers import CacheTiers
from gmlx_server.engine.disk_cache import DiskCache
from gmlx_server.engine.drafter import Drafter, with_drafter
from gmlx_server.engine.kernels.fast_ops import MLX_OPS
from gmlx_server.engine.prompt_cache import PromptCache
from gmlx_server.engine.scheduler import Inbox, Pace, Scheduler
from gmlx_server.engine.scheduler import Job as _Job
from gmlx_server.engine.spec_round import Speculator
from gmlx_server.engine.structured import GrammarTokenizerCache
from gmlx_server.engine.types import (
    EngineClosed,
    EngineStats,
    FinishReason,
    GenerationRequest,
    MemorySnapshot,
    PromptCacheStats,
    RequestRow,
    TokenEvent,
)

log = logging.getLogger("gmlx.engine")


class Handle:
    """The asyncio side of one request: iterate its events, or cancel it."""

    def __init__(self, request_id: str, job_cancel: threading.Event) -> None:
        self.request_id = request_id
        self._cancel = job_cancel
        self._queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self._done = False

    def push(self, event: TokenEvent) -> None:
        self._queue.put_nowait(event)

    def cancel(self) -> None:
        self._cancel.set()

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[TokenEvent]:
        while not self._done:
            event = await self._queue.get()
            self._done = event.finish_reason is not None
            yield event


class MLXEngine(EngineBase):
    """Runs one model's requests on its own thread, decoding up to `decode_batch` of them together."""

    def __init__(self, loader: Callable[[], Any], decode_batch: int = 1, prompt_cache_bytes: int = 0,
                 drafter_loader: Callable[[Any], Drafter] | None = None, disk: DiskCache | None = None) -> None:
        self._jobs: Inbox = queue.Queue()
        pace = self.pace = Pace()
        # Only the engine thread mutates it; others read its published stats or peek under its lock. The pace
        # is read through a local: a closure over self would be a cycle, and an unloaded engine's arrays are
        # freed by reference counting alone (serving/residency.py).
        self._prompt_cache = CacheTiers(PromptCache(prompt_cache_bytes, spill=disk.put if disk else None), disk,
                                        lambda: pace.prefill) if prompt_cache_bytes > 0 else None
        self._disk = disk
        self._live: dict[str, _Job] = {}
        self._lock = threading.Lock()
        self._decode_batch = max(1, decode_batch)
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._fault: str | None = None  # why the engine thread died, if it did
        self._closing = False
        self._measured = MemorySnapshot()  # the engine thread refreshes it
        self.memory = self._measured
        self.grammar_tokenizers = GrammarTokenizerCache()  # llguidance's vocabulary: built once, on first use
        self._drafter: Drafter | None = None
        self._thread = threading.Thread(target=self._main, args=(loader, drafter_loader), name="gmlx-engine",
                                        daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._load_error is not None:
            raise self._load_error
        loaded = self._loaded
        self.info, self.tokenizer, self.template = loaded.info, loaded.tokenizer, loaded.template
        if self._drafter is not None:
            self.info = with_drafter(self.info, self._drafter)

    def _main(self, loader: Callable[[], Any], drafter_loader: Callable[[Any], Drafter] | None) -> None:
        try:
            self._loaded = loader()  # the load itself runs on this thread: its arrays live on this stream
            if drafter_loader is not None:
                self._drafter = drafter_loader(self._loaded)
        except BaseException as e:  # surfaced to the constructor's caller
            self._load_error = e
            self._ready.set()
            return
        self._ready.set()
        loaded = self._loaded
        n_vocab = vocab_size(loaded.header)  # the logits' width, which the grammar mask must cover

        def grammar_tokenizer() -> Any:
            return self.grammar_tokenizers.get(loaded.tokenizer, n_vocab)

        try:
            Scheduler(loaded.model, loaded.tokenizer, self._decode_batch, self._jobs, self._forget, self._measured,
                      grammar_tokenizer, self._prompt_cache, self.pace, loaded.make_cache,
                      Speculator(self._drafter) if self._drafter is not None else None, loaded.vision,
                      loaded.kernels or MLX_OPS).run()
        except BaseException as e:  # the loop itself broke: say why, and end every request it held
            self._fault = f"{type(e).__name__}: {e}"
            log.critical("the engine thread of %s died: %s", loaded.info.model_id, self._fault, exc_info=e)
            self._fail_live("error", f"the engine stopped: {self._fault}")

    @property
    def fault(self) -> str | None:
        """None while the engine serves (or after close()); otherwise why its thread is gone."""
        if self._closing:
            return None
        if self._fault is None and not self._thread.is_alive():
            return "the engine thread is not running"
        return self._fault

    def _fail_live(self, reason: FinishReason, error: str | None = None) -> None:
        """Give every request still held a final event (from any thread: emit is thread-safe)."""
        with self._lock:
            jobs, self._live = list(self._live.values()), {}
        for job in jobs:
            job.progress.state = "done"
            job.emit(TokenEvent("", None, finish_reason=reason, error=error))

    def _forget(self, job: _Job) -> None:
        with self._lock:
            self._live.pop(job.request.request_id, None)

    def submit(self, request: GenerationRequest) -> Handle:
        if self._closing or self._fault is not None or not self._thread.is_alive():
            raise EngineClosed(f"the engine of {self.info.model_id} is {'closed' if self._closing else 'down'}")
        loop = asyncio.get_running_loop()
        cancelled = threading.Event()
        handle = Handle(request.request_id, cancelled)

        def emit(event: TokenEvent) -> None:
            try:
                loop.call_soon_threadsafe(handle.push, event)
            except RuntimeError:  # the submitting loop is closed: nobody is listening any more
                cancelled.set()

        job = _Job(request, emit, cancelled)
        with self._lock:
            self._live[request.request_id] = job
        self._jobs.put(job)
        if self._fault is not None:  # the thread died while this was submitted: nobody will take the job
            self._fail_live("error", f"the engine stopped: {self._fault}")
        return handle

    def generate_sync(self, request: GenerationRequest, on_event: Callable[[TokenEvent], None]) -> None:
        """Blocking generation for the CLI: events are delivered on the engine thread."""
        done = threading.Event()

        def emit(event: TokenEvent) -> None:
            try:
                on_event(event)
            except Exception:  # e.g. a closed pipe: stop generating rather than break the engine thread
                log.exception("the CLI's event handler failed; cancelling %s", request.request_id)
                job.cancelled.set()
            if event.finish_reason is not None:
                done.set()

        with self._lock:
            self._live[request.request_id] = (job := _Job(request, emit))
        self._jobs.put(job)
        try:
            while not done.wait(0.1):
                pass
        except KeyboardInterrupt:
            job.cancelled.set()
            done.wait()

    def stats(self) -> EngineStats:
        now = time.perf_counter()
        with self._lock:
            jobs = list(self._live.values())
        rows = tuple(_row(j, now, self._expected_warm(j, jobs[:i])) for i, j in enumerate(jobs)
                     if j.progress.state != "done")
        # Queued rows first, as the metrics snapshot lists them.
        rows = tuple(sorted(rows, key=lambda r: r.state != "queued"))
        # A queued request with a free slot holds it (it is next to prefill): in flight, not waiting for a slot.
        in_flight = min(len(rows), self._decode_batch)
        return EngineStats(self._decode_batch, in_flight, len(rows) - in_flight, rows, self.pace.step_s,
                           self.pace.join_s, self.pace.step_ctx, self.pace.step_s_per_ctx, self.pace.leave_s)

    def expected_warm(self, prompt_tokens: Sequence[int]) -> int:
        """The cache's RAM tier now, or a prefix shared with a live request (every one is ahead of a new one)."""
        if self._prompt_cache is None:
            return 0
        with self._lock:
            jobs = list(self._live.values())
        return self._prompt_cache.expected(prompt_tokens, (j.request.prompt_tokens for j in jobs))

    def _expected_warm(self, job: _Job, ahead: Sequence[_Job]) -> int:
        """A queued job's warm tokens to come, worked out once (the jobs submitted before it are ahead of it)."""
        if job.progress.state != "queued" or self._prompt_cache is None:
            return 0
        if job.expected_warm is None:
            job.expected_warm = self._prompt_cache.expected(job.request.prompt_tokens,
                                                            (a.request.prompt_tokens for a in ahead))
        return job.expected_warm

    def cache_stats(self) -> PromptCacheStats:
        """The prompt cache's counters as the engine thread last published them."""
        pc = self._prompt_cache
        return PromptCacheStats(**pc.published()) if pc is not None else PromptCacheStats()

    def cache_peek(self, prompt_tokens: Sequence[int]) -> tuple[str, int]:
        """The tier and warm tokens a request with this prompt would get now (no MLX: the store is pure)."""
        return self._prompt_cache.peek(prompt_tokens) if self._prompt_cache is not None else ("miss", 0)

    def reset_cache(self) -> bool:
        """Empty the prompt cache; the engine thread does it between steps."""
        if self._prompt_cache is None or not self._thread.is_alive():
            return False
        self._jobs.put(self._prompt_cache.reset)
        return True

    def shed(self, request_id: str, reason: str) -> bool:
        """Ask the engine thread to end a decoding request with finish_reason "shed" (memory governor)."""
        with self._lock:
            job = self._live.get(request_id)
        if job is None:
            return False
        job.shed_reason = reason
        return True

    def close(self) -> None:
        """Stop the thread; afterwards every request submitted has had its final event."""
        self._closing = True
        with self._lock:
            for job in self._live.values():
                job.cancelled.set()
        self._jobs.put(None)
        self._thread.join(timeout=30)
        self._fail_live("cancelled")  # what a dead or stuck thread never ended
        if self._disk is not None:
            self._disk.close()  # the queued snapshots reach the disk before the engine is gone


def _row(job: _Job, now: float, expected_warm: int) -> RequestRow:
    p, r = job.progress, job.request
    ttft = p.first_token - p.submitted if p.first_token else None
    rate = None
    if p.first_token and p.generated > 1:
        rate = (p.generated - 1) / max(now - p.first_token, 1e-9)
    return RequestRow(r.request_id, p.state, len(r.prompt_tokens), p.generated, r.max_tokens,
                      now - p.submitted, ttft, rate, p.cache_tier, p.warm_tokens, p.speculative, r.priority,
                      p.prefilled, expected_warm)
