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
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from gmlx_server.engine.generate import Progress, Runner
from gmlx_server.engine.types import EngineStats, GenerationRequest, RequestRow, TokenEvent

log = logging.getLogger("gmlx.engine")


@dataclass
class _Job:
    request: GenerationRequest
    emit: Callable[[TokenEvent], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    progress: Progress = field(default_factory=Progress)


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


class MLXEngine:
    """Runs one model's requests on its own thread. Batch width 1 for now; continuous batching plugs in here."""

    def __init__(self, loader: Callable[[], Any], decode_batch: int = 1) -> None:
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._active: dict[str, _Job] = {}
        self._waiting: dict[str, _Job] = {}
        self._lock = threading.Lock()
        self._decode_batch = decode_batch
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, args=(loader,), name="gmlx-engine", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._load_error is not None:
            raise self._load_error
        loaded = self._loaded
        self.info, self.tokenizer, self.template = loaded.info, loaded.tokenizer, loaded.template

    def _main(self, loader: Callable[[], Any]) -> None:
        try:
            self._loaded = loader()  # the load itself runs on this thread: its arrays live on this stream
            self._runner = Runner(self._loaded.model, self._loaded.tokenizer)
        except BaseException as e:  # surfaced to the constructor's caller
            self._load_error = e
            self._ready.set()
            return
        self._ready.set()
        while (job := self._jobs.get()) is not None:
            self._run(job)

    def _run(self, job: _Job) -> None:
        rid = job.request.request_id
        with self._lock:
            self._waiting.pop(rid, None)
            self._active[rid] = job
        try:
            if job.cancelled.is_set():
                job.emit(TokenEvent("", None, finish_reason="cancelled"))
            else:
                self._runner.run(job.request, job.emit, job.cancelled.is_set, job.progress)
        except Exception as e:  # one request's failure must not take the engine down
            log.exception("request %s failed", rid)
            job.emit(TokenEvent("", None, finish_reason="error", error=f"{type(e).__name__}: {e}"))
        finally:
            with self._lock:
                self._active.pop(rid, None)

    def submit(self, request: GenerationRequest) -> Handle:
        loop = asyncio.get_running_loop()
        cancelled = threading.Event()
        handle = Handle(request.request_id, cancelled)

        def emit(event: TokenEvent) -> None:
            loop.call_soon_threadsafe(handle.push, event)

        job = _Job(request, emit, cancelled)
        with self._lock:
            self._waiting[request.request_id] = job
        self._jobs.put(job)
        return handle

    def generate_sync(self, request: GenerationRequest, on_event: Callable[[TokenEvent], None]) -> None:
        """Blocking generation for the CLI: events are delivered on the engine thread."""
        done = threading.Event()

        def emit(event: TokenEvent) -> None:
            on_event(event)
            if event.finish_reason is not None:
                done.set()

        with self._lock:
            self._waiting[request.request_id] = (job := _Job(request, emit))
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
            jobs = list(self._waiting.values()) + list(self._active.values())
        rows = tuple(_row(j, now) for j in jobs)
        return EngineStats(self._decode_batch, len(self._active), len(self._waiting), rows)

    def close(self) -> None:
        with self._lock:
            for job in list(self._waiting.values()) + list(self._active.values()):
                job.cancelled.set()
        self._jobs.put(None)
        self._thread.join(timeout=30)


def _row(job: _Job, now: float) -> RequestRow:
    p, r = job.progress, job.request
    ttft = p.first_token - p.submitted if p.first_token else None
    rate = None
    if p.first_token and p.generated > 1:
        rate = (p.generated - 1) / max(now - p.first_token, 1e-9)
    return RequestRow(r.request_id, p.state, len(r.prompt_tokens), p.generated, r.max_tokens,
                      now - p.submitted, ttft, rate)
