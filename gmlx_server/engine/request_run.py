"""One request's life on the engine thread: chunked prefill into its own cache, then token handling.

Decoding itself is batched across requests (batch.py); this module owns everything per request:
sampler, detokenizer, stop strings, thinking budget, logprobs, timings and the emitted events.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import mlx.core as mx

from gmlx_plan.memory import PREFILL_CHUNK  # the planner budgets this chunk's transient memory
from gmlx_server.engine.arch import make_cache
from gmlx_server.engine.cache_tiers import CacheTiers
from gmlx_server.engine.detokenizer import IncrementalDetokenizer
from gmlx_server.engine.kv_snapshot import has_window, restore, take
from gmlx_server.engine.last_row import last_row_only
from gmlx_server.engine.sampling import Draw, RequestSampler, top_alternatives
from gmlx_server.engine.structured import GrammarConstraint, GrammarViolation
from gmlx_server.engine.text_stream import StepResult, TextStream
from gmlx_server.engine.thinking import ThinkingBudget
from gmlx_server.engine.types import (
    FinishReason,
    GenerationRequest,
    RequestState,
    SpeculativeStats,
    Timings,
    TokenEvent,
)
from gmlx_server.engine.vision.prefill import VisionRuntime, bind_images

log = logging.getLogger("gmlx.engine")
GrammarTokenizer = Callable[[], Any]  # the model's llguidance tokenizer, built on first use


@dataclass
class Progress:
    """Live state of a request, read by stats() from other threads (plain attribute reads)."""

    state: RequestState = "queued"
    submitted: float = field(default_factory=time.perf_counter)
    started: float | None = None
    first_token: float | None = None
    generated: int = 0
    cache_tier: str = "miss"
    warm_tokens: int = 0
    prefilled: int = 0  # prompt tokens in the cache so far (restored or computed)
    speculative: SpeculativeStats | None = None  # a speculative model's rounds for this request


def describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class RequestRun:
    """A request from prefill to its final event. Every method runs on the engine thread."""

    def __init__(self, model: Any, tokenizer: Any, req: GenerationRequest, emit: Callable[[TokenEvent], None],
                 cancelled: Callable[[], bool], progress: Progress, chunk: int = PREFILL_CHUNK,
                 grammar_tokenizer: GrammarTokenizer | None = None, prompt_cache: CacheTiers | None = None,
                 caches: Callable[[], list[Any]] | None = None, vision: VisionRuntime | None = None) -> None:
        self.req, self.emit, self.cancelled, self.progress = req, emit, cancelled, progress
        self.images = bind_images(model, vision, req)  # a prompt with images prefills through the model's vision tower
        self.model, self._text = self.images.model, model
        self._caches = caches or (lambda: make_cache(model))  # the loader's: quantized layers where configured
        self._grammar_tokenizer = grammar_tokenizer
        self.constraint: GrammarConstraint | None = None
        self.sampler = RequestSampler(req.sampling, tokenizer.special_ids)
        detok = IncrementalDetokenizer(tokenizer)
        self.stream = TextStream(detok.add, detok.flush, req.stop, tokenizer.eos_ids, req.max_tokens)
        self.budget = (ThinkingBudget(req.thinking, lambda s: tokenizer.encode(s, add_special_tokens=False),
                                      req.starts_in_thinking) if req.thinking else None)
        self.history: list[int] | None = list(self.images.token_ids) if self.sampler.needs_history else None
        self.cache: list[Any] | None = None
        self._tokens = list(req.prompt_tokens)  # what prefill feeds: the prompt, or prompt + output on a rewind
        self._prompt = mx.array(self._tokens, dtype=mx.int32)
        self.output: list[int] = []  # accepted tokens, so a rewind can rebuild the KV
        self.rewinds, self.probation = 0, False
        self.spans: list[tuple[int, int, float]] = []  # computed prompt tokens [start, end) and their seconds
        self.restore_s = 0.0  # seconds the prompt cache's warm tokens took to come back
        self._pos, self._chunk = 0, chunk
        self._store, self._stops, self._window = prompt_cache, [len(req.prompt_tokens)], False
        self.next_input: int | None = None  # the token the next decode step feeds for this row
        self.prefill_s = 0.0
        self._t_decode = 0.0
        self.draft: Any = None  # the drafter's state for this request (spec_round.DraftRun), on a speculative model

    @property
    def prefilled(self) -> bool:
        return self.next_input is not None

    def prefill_step(self) -> bool:
        """Run one prefill chunk; on the last one sample the first token. True once the request is done."""
        if self.cache is None:
            self.cache = self._begin()
        if self.cancelled():
            return self.finish("cancelled")
        n = len(self._tokens)
        end = min(self._pos + self._chunk, next(s for s in self._stops if s > self._pos))
        end = self.images.chunk_end(self._pos, end)  # an image that prefills whole is never cut
        t0 = time.perf_counter()
        if end < n:
            self.model(self._prompt[self._pos: end][None], cache=self.cache)
            mx.eval([c.state for c in self.cache])
            self._computed(end, t0)
            self._checkpoint()
            return False
        with last_row_only(self._text):
            logits = self.model(self._prompt[self._pos:][None], cache=self.cache).logits[:, -1, :]
        if self.rewinds:
            mx.eval(logits)
            self._computed(end, t0)
            return self._resume(logits)
        draw = self.draw(logits)
        mx.eval(draw.token)  # sync once so prefill time is measured, not deferred into decode
        self._computed(end, t0)
        self.prefill_s = time.perf_counter() - (self.progress.started or 0.0)
        if self._store is not None and not self._window:
            self._save(len(self.req.prompt_tokens), "prompt")
        self.progress.state = "decode"
        self._t_decode = time.perf_counter()
        return self.accept(draw)

    def _computed(self, end: int, t0: float) -> None:
        """A chunk run through the model: its span and seconds, the only work the prefill pace counts."""
        self.spans.append((self._pos, end, time.perf_counter() - t0))
        self._pos = self.progress.prefilled = end

    def _begin(self) -> list[Any]:
        self.progress.state = "prefill"
        if self.rewinds:
            return self._caches()
        self.progress.started = time.perf_counter()
        self._start_grammar()
        return self._warm_start()

    def rewind(self) -> None:
        """Drop this row's KV and prefill its prompt and output again: the batch it decoded in failed, and
        recomputing is how the rows not at fault go on. The grammar, stream and sampler keep their state."""
        self.rewinds += 1
        self._tokens = [*self.req.prompt_tokens, *self.output]
        self._prompt = mx.array(self._tokens, dtype=mx.int32)
        self._pos, self._stops, self._store = 0, [len(self._tokens)], None
        self.cache, self.next_input, self.probation, self.draft = None, None, True, None

    def _resume(self, logits: mx.array) -> bool:
        """The end of a rewound prefill: the next token, exactly as the failed decode step would have made it."""
        self.progress.state = "decode"
        forced = self.forced_next()
        return self.accept(None, forced) if forced is not None else self.accept(self.draw(logits))

    def _warm_start(self) -> list[Any]:
        """Fresh caches, or ones restored from the longest cached prefix; plan where to checkpoint."""
        prompt, store, make = self.req.prompt_tokens, self._store, self._caches
        if store is None:
            return make()
        hit = store.lookup(prompt)
        if hit is None:
            cache = make()
        else:
            t0 = time.perf_counter()
            cache = restore(hit.entry, hit.tokens, make)
            mx.eval([c.state for c in cache])  # the copy (a disk hit's read too) happens here, timed as a restore
            self.restore_s = time.perf_counter() - t0
            store.restored(hit, self.restore_s)
            self._pos = self.progress.warm_tokens = self.progress.prefilled = hit.tokens
            self.progress.cache_tier = hit.tier
        self._window = has_window(cache)
        n = len(prompt)
        # A sliding-window cache cannot be cut back: snapshot it one short of the prompt (the exact tier)
        # and at message boundaries (the ckpt tier). Any cache may pin an anchor prefix.
        stops = {n - 1, *self.req.cache_boundaries} if self._window else set()
        if self.req.cache_anchor is not None:
            stops.add(self.req.cache_anchor)
        self._stops = [*sorted(s for s in stops if self._pos < s < n), n]
        return cache

    def _checkpoint(self) -> None:
        if self._store is not None and self._pos in self._stops:
            last = self._pos == len(self.req.prompt_tokens) - 1 and self._window
            self._save(self._pos, "prompt" if last else "ckpt")

    def _save(self, upto: int, kind: Literal["prompt", "ckpt"]) -> None:
        prompt = self.req.prompt_tokens
        assert self._store is not None and self.cache is not None
        tail = prompt[upto] if upto == len(prompt) - 1 else None
        entry = take(self.cache, prompt[:upto], kind, tail, pinned=upto == self.req.cache_anchor)
        if entry is not None:
            self._store.store(entry)

    def _start_grammar(self) -> None:
        """The request's grammar becomes its sampler's last processor (the tokenizer is built once per model)."""
        if self.req.grammar is None:
            return
        if self._grammar_tokenizer is None:
            raise RuntimeError("this engine cannot constrain output: no grammar tokenizer")
        self.constraint = GrammarConstraint(self.req.grammar, self._grammar_tokenizer())
        self.sampler.constrain(self.constraint)

    def draw(self, logits: mx.array, top: mx.array | None = None, logprobs: mx.array | None = None) -> Draw:
        """This step's token; `top`, the batch's argmax for this row, serves a greedy row that needs nothing else;
        `logprobs`, the batch's log-softmax row, a sampled row without processors."""
        if top is not None and self.bulk_greedy:
            return Draw(top, logits)
        hist = mx.array(self.history, dtype=mx.int32) if self.history is not None else None
        return self.sampler(logits, hist, logprobs)

    @property
    def bulk_greedy(self) -> bool:
        """Greedy with nothing per row to compute (processors, logprobs): one argmax over the batch serves it."""
        req = self.req
        return self.sampler.params.greedy and self.sampler.plain and not (req.logprobs or req.top_logprobs)

    @property
    def queues_ahead(self) -> bool:
        """Its next forward pass may be queued before this step's token is accepted: it goes on past that token,
        and accepting it reads nothing of the step's arrays (logprobs would wait behind the queued pass)."""
        req = self.req
        return not (req.logprobs or req.top_logprobs) and self.stream.generated + 1 < req.max_tokens

    def accept(self, draw: Draw | None, forced: int | None = None) -> bool:
        """Take this step's token (sampled, or forced by the thinking budget); emit; True when finished."""
        token = forced if forced is not None else int(draw.token.item())  # type: ignore[union-attr,arg-type]
        if self.progress.first_token is None:
            self.progress.first_token = time.perf_counter()
        lp, tops = self._logprobs(draw, token) if draw is not None and forced is None else (None, ())
        if self.history is not None:
            self.history.append(token)
        self.output.append(token)
        try:
            step = self._feed(token)
        except GrammarViolation as e:  # this request's failure only: the batch goes on
            return self.finish("error", error=str(e))
        self.progress.generated = self.stream.generated
        if self.budget and step.text:
            self.budget.observe(step.text)
        finish = step.finish or ("cancelled" if self.cancelled() else None)
        if finish is not None:
            return self.finish(finish, TokenEvent(step.text, token, lp, tops, stop_string=step.stop_string))
        self.emit(TokenEvent(step.text, token, lp, tops))
        self.next_input = token
        return False

    def accept_guarded(self, draw: Draw | None, forced: int | None = None) -> bool:
        """accept(), with a failure there (detokenizing, stop strings, grammar) ending this request only."""
        try:
            return self.accept(draw, forced)
        except Exception as e:
            log.exception("accepting a token failed for %s", self.req.request_id)
            return self.finish("error", error=describe(e))

    def count_round(self, drafted: int, accepted: int) -> None:
        p = self.progress
        p.speculative = (p.speculative or SpeculativeStats()).plus(drafted, accepted)

    def _feed(self, token: int) -> StepResult:
        """The token's text; a grammar sees every accepted token and ends the request once complete."""
        if self.constraint is None:
            return self.stream.feed(token)
        self.constraint.consume(token)
        step = self.stream.feed(token)
        if step.finish is None and self.constraint.is_finished:
            return StepResult(step.text + self.stream.drain(), "stop")
        return step

    def forced_next(self) -> int | None:
        return self.budget.next_forced() if self.budget else None

    def finish(self, reason: FinishReason, last: TokenEvent | None = None, error: str | None = None) -> bool:
        p = self.progress
        ttft = p.first_token - p.submitted if p.first_token else None
        decode_s = time.perf_counter() - self._t_decode if self._t_decode else 0.0
        timings = Timings(len(self.req.prompt_tokens), self.stream.generated, self.prefill_s, decode_s, ttft,
                          p.warm_tokens, p.speculative, tuple(self.spans), self.restore_s, p.cache_tier)
        ev = last or TokenEvent("", None)
        p.state = "done"  # before the final event: a client that sees it must not find this row in flight
        self.emit(TokenEvent(ev.text, ev.token_id, ev.logprob, ev.top_logprobs, reason, ev.stop_string,
                             error, timings))
        self.cache = self.draft = None
        return True

    def _logprobs(self, draw: Draw, token: int) -> tuple[float | None, tuple[tuple[int, float], ...]]:
        req = self.req
        if not (req.logprobs or req.top_logprobs):
            return None, ()
        row = draw.logprobs[0]
        lp = float(row[token].item())  # type: ignore[arg-type]
        if req.top_logprobs <= 0:
            return lp, ()
        idx = top_alternatives(row, req.top_logprobs)
        return lp, tuple(zip(idx.tolist(), row[idx].tolist(), strict=True))  # type: ignore[arg-type]
