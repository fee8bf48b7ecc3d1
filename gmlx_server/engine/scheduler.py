"""The engine thread's loop: admit queued requests, prefill one chunk, decode one batched step, repeat.

One prefill chunk between decode steps keeps running streams decoding while a long prompt loads.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from gmlx_server.engine.batch import BatchDecoder
from gmlx_server.engine.generate import GrammarTokenizer, Progress, Sequence
from gmlx_server.engine.prompt_cache import PromptCache
from gmlx_server.engine.types import GenerationRequest, TokenEvent

log = logging.getLogger("gmlx.engine")


@dataclass
class Job:
    request: GenerationRequest
    emit: Callable[[TokenEvent], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    progress: Progress = field(default_factory=Progress)
    shed_reason: str | None = None  # set by another thread; the engine thread ends the request with "shed"


@dataclass
class MemorySnapshot:
    """MLX allocator figures, refreshed by the engine thread (other threads must not call MLX)."""

    active_bytes: int = 0
    cache_bytes: int = 0
    peak_bytes: int = 0


Control = Callable[[], None]  # work another thread asks the engine thread to do (e.g. reset the prompt cache)
Inbox = queue.Queue[Job | Control | None]


class Scheduler:
    def __init__(self, model: Any, tokenizer: Any, width: int, inbox: Inbox,
                 forget: Callable[[Job], None], memory: MemorySnapshot,
                 grammar_tokenizer: GrammarTokenizer | None = None, prompt_cache: PromptCache | None = None) -> None:
        self.model, self.tokenizer, self.width = model, tokenizer, width
        self.grammar_tokenizer, self.prompt_cache = grammar_tokenizer, prompt_cache
        self.inbox, self.forget, self.memory = inbox, forget, memory
        self.waiting: deque[Job] = deque()
        self.prefilling: tuple[Job, Sequence] | None = None
        self.batch = BatchDecoder(model)
        self._jobs: dict[int, Job] = {}  # id(Sequence) -> its job, to forget finished rows

    def run(self) -> None:
        while self._admit():
            self._drop_cancelled_waiting()
            self._start_prefill()
            self._prefill_chunk()
            self._decode_step()
            self._measure()
        self._shutdown()

    def _measure(self) -> None:
        m = self.memory
        m.active_bytes, m.cache_bytes, m.peak_bytes = (
            mx.get_active_memory(), mx.get_cache_memory(), mx.get_peak_memory())

    def _admit(self) -> bool:
        """Move new jobs to `waiting`; block only when there is nothing else to do. False on shutdown."""
        idle = not (self.waiting or self.prefilling or len(self.batch))
        try:
            item = self.inbox.get() if idle else self.inbox.get_nowait()
            while True:
                if item is None:
                    return False
                if isinstance(item, Job):
                    self.waiting.append(item)
                else:
                    item()
                item = self.inbox.get_nowait()
        except queue.Empty:
            return True

    def _drop_cancelled_waiting(self) -> None:
        for job in [j for j in self.waiting if j.cancelled.is_set()]:
            self.waiting.remove(job)
            self.forget(job)
            job.emit(TokenEvent("", None, finish_reason="cancelled"))

    def _start_prefill(self) -> None:
        if self.prefilling is None and self.waiting and len(self.batch) < self.width:
            job = self.waiting.popleft()
            seq = Sequence(self.model, self.tokenizer, job.request, job.emit, job.cancelled.is_set, job.progress,
                           grammar_tokenizer=self.grammar_tokenizer, prompt_cache=self.prompt_cache)
            self.prefilling = (job, seq)

    def _prefill_chunk(self) -> None:
        if self.prefilling is None:
            return
        job, seq = self.prefilling
        try:
            done = seq.finish("shed", error=job.shed_reason) if job.shed_reason else seq.prefill_step()
        except Exception as e:  # one request's failure must not take the engine down
            log.exception("prefill of %s failed", job.request.request_id)
            done = seq.finish("error", error=f"{type(e).__name__}: {e}")
        if done:
            self.prefilling = None
            self.forget(job)
        elif seq.prefilled:
            self.prefilling = None
            self._jobs[id(seq)] = job
            self.batch.add(seq)

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
            if len(self.batch):
                self.batch.step()
        except Exception as e:
            log.exception("decode step failed for %d rows", len(self.batch))
            self.batch.fail_all(f"{type(e).__name__}: {e}")
        for seq in before:
            if seq not in self.batch.rows:
                self.forget(self._jobs.pop(id(seq)))

    def _shutdown(self) -> None:
        for job in self.waiting:
            job.emit(TokenEvent("", None, finish_reason="cancelled"))
        if self.prefilling is not None:
            self.prefilling[1].finish("cancelled")
        for seq in list(self.batch.rows):
            seq.finish("cancelled")
