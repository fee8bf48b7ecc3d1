"""Prefill + decode for one request on the engine thread (all MLX calls happen here)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from gmlx_server.engine.detokenizer import IncrementalDetokenizer
from gmlx_server.engine.sampling import Draw, RequestSampler, top_alternatives
from gmlx_server.engine.stream import TextStream
from gmlx_server.engine.thinking import ThinkingBudget
from gmlx_server.engine.types import GenerationRequest, RequestState, Timings, TokenEvent

PREFILL_CHUNK = 512


@dataclass
class Progress:
    """Live state of a running request, read by stats() from other threads (plain attribute reads)."""

    state: RequestState = "queued"
    submitted: float = field(default_factory=time.perf_counter)
    started: float | None = None
    first_token: float | None = None
    generated: int = 0


class Runner:
    """Runs requests against one loaded model. Owned by the engine thread."""

    def __init__(self, model: Any, tokenizer: Any, prefill_chunk: int = PREFILL_CHUNK) -> None:
        self.model, self.tok, self.chunk = model, tokenizer, prefill_chunk
        self._special = sorted(tokenizer.special_ids)

    def logits(self, tokens: mx.array, cache: list[Any]) -> mx.array:
        return self.model(tokens[None], cache=cache).logits[:, -1, :]

    def prefill(self, prompt: list[int], cache: list[Any], cancelled: Callable[[], bool]) -> mx.array | None:
        """Feed all but the last chunk in pieces (so the cache grows stepwise); return the last logits."""
        toks = mx.array(prompt, dtype=mx.int32)
        pos = 0
        while len(prompt) - pos > self.chunk:
            self.model(toks[pos: pos + self.chunk][None], cache=cache)
            mx.eval([c.state for c in cache])
            pos += self.chunk
            if cancelled():
                return None
        return self.logits(toks[pos:], cache)

    def run(self, req: GenerationRequest, emit: Callable[[TokenEvent], None], cancelled: Callable[[], bool],
            progress: Progress) -> None:
        progress.state, progress.started = "prefill", time.perf_counter()
        cache = self.model.make_cache()
        sampler = RequestSampler(req.sampling, self._special)
        logits = self.prefill(list(req.prompt_tokens), cache, cancelled)
        if logits is None:
            emit(self._final("cancelled", progress, req, 0.0))
            return
        history = list(req.prompt_tokens) if sampler.needs_history else None
        draw = self._draw(sampler, logits, history, req)
        mx.eval(draw.token)  # sync once so prefill time is measured, not deferred into decode
        prefill_s = time.perf_counter() - progress.started
        progress.state = "decode"
        self._decode(req, sampler, cache, draw, history, emit, cancelled, progress, prefill_s)

    def _draw(self, sampler: RequestSampler, logits: mx.array, history: list[int] | None,
              req: GenerationRequest) -> Draw:
        hist = mx.array(history, dtype=mx.int32) if history is not None else None
        draw = sampler(logits, hist)
        mx.async_eval(draw.token, draw.logprobs) if (req.logprobs or req.top_logprobs) else mx.async_eval(draw.token)
        return draw

    def _decode(self, req: GenerationRequest, sampler: RequestSampler, cache: list[Any], draw: Draw,
                history: list[int] | None, emit: Callable[[TokenEvent], None], cancelled: Callable[[], bool],
                progress: Progress, prefill_s: float) -> None:
        detok = IncrementalDetokenizer(self.tok)
        stream = TextStream(detok.add, detok.flush, req.stop, self.tok.eos_ids, req.max_tokens)
        budget = (ThinkingBudget(req.thinking, lambda s: self.tok.encode(s, add_special_tokens=False),
                                 req.starts_in_thinking) if req.thinking else None)
        forced: int | None = None
        t_decode = time.perf_counter()
        while True:
            token = forced if forced is not None else int(draw.token.item())  # type: ignore[arg-type]
            if progress.first_token is None:
                progress.first_token = time.perf_counter()
            lp, tops = self._logprobs(draw, token, req) if forced is None else (None, ())
            forced = budget.next_forced() if budget else None
            if history is not None:
                history.append(token)
            # Launch the next step before the Python work on this token, so they overlap.
            nxt = self._next(token, cache, sampler, history, req, forced is None)
            step = stream.feed(token)
            progress.generated = stream.generated
            if budget and step.text:
                budget.observe(step.text)
            if step.finish is None and cancelled():
                step.finish = "cancelled"
            if step.finish is not None:
                timings = self._timings(req, stream.generated, prefill_s, t_decode, progress)
                emit(TokenEvent(step.text, token, lp, tops, step.finish, step.stop_string, timings=timings))
                return
            emit(TokenEvent(step.text, token, lp, tops))
            if nxt is not None:
                draw = nxt

    def _next(self, token: int, cache: list[Any], sampler: RequestSampler, history: list[int] | None,
              req: GenerationRequest, sample: bool) -> Draw | None:
        logits = self.logits(mx.array([token], dtype=mx.int32), cache)
        if not sample:
            mx.eval([c.state for c in cache])  # the forced token still has to enter the cache
            return None
        return self._draw(sampler, logits, history, req)

    @staticmethod
    def _logprobs(draw: Draw, token: int, req: GenerationRequest) -> tuple[float | None, tuple[tuple[int, float], ...]]:
        if not (req.logprobs or req.top_logprobs):
            return None, ()
        row = draw.logprobs[0]
        lp = float(row[token].item())  # type: ignore[arg-type]
        if req.top_logprobs <= 0:
            return lp, ()
        idx = top_alternatives(row, req.top_logprobs)
        vals = row[idx]
        return lp, tuple(zip(idx.tolist(), vals.tolist(), strict=True))  # type: ignore[arg-type]

    @staticmethod
    def _timings(req: GenerationRequest, generated: int, prefill_s: float, t_decode: float,
                 progress: Progress) -> Timings:
        ttft = progress.first_token - progress.submitted if progress.first_token else None
        return Timings(len(req.prompt_tokens), generated, prefill_s, time.perf_counter() - t_decode, ttft)

    def _final(self, reason: Any, progress: Progress, req: GenerationRequest, prefill_s: float) -> TokenEvent:
        t = Timings(len(req.prompt_tokens), progress.generated, prefill_s, 0.0, None)
        return TokenEvent("", None, finish_reason=reason, timings=t)
