"""Continuous batching: every decoding request advances one token per step in one batched forward.

A request prefills alone into its own cache (exact, and chunked so it never stalls the batch for
long), then joins the batch by merging that cache into mlx-vlm's left-padded batch caches; a
finished request leaves by filtering its row out. Weights are read once per step for all rows,
which is where batching pays on a memory-bound CPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_vlm.models.cache import BatchKVCache, BatchRotatingKVCache, KVCache, RotatingKVCache

from gmlx_server.engine.kernels.fast_ops import MLX_OPS, Primitives
from gmlx_server.engine.kv_half import batch_half
from gmlx_server.engine.kv_quant import as_batch_quantized
from gmlx_server.engine.request_run import RequestRun, describe
from gmlx_server.engine.sampling import Draw
from gmlx_server.engine.spec_round import Speculator

log = logging.getLogger("gmlx.engine")


def _as_batch(cache: Any) -> Any:
    """A single-row cache from prefill -> the batch cache type that can extend/filter rows."""
    quantized = as_batch_quantized(cache)
    if quantized is not None:  # quantized KV stays quantized in the batch
        return quantized
    half = batch_half(cache)
    if half is not None:  # and float16 KV float16
        return half
    if isinstance(cache, RotatingKVCache):
        return BatchRotatingKVCache.merge([cache])
    if isinstance(cache, KVCache):
        return BatchKVCache.merge([cache])
    raise TypeError(f"cannot batch a {type(cache).__name__}")


@dataclass
class _Forward:
    """The batch's forward pass on one token a row: the last position's logits and what the rows' draws share."""

    logits: mx.array
    top: mx.array | None  # the batch's argmax, for its bulk greedy rows
    lp: mx.array | None  # the batch's log-softmax, for its sampled rows that read one

    def arrays(self) -> list[mx.array]:
        return [a for a in (self.logits, self.top, self.lp) if a is not None]

    def rows(self, keep: mx.array) -> _Forward:
        return _Forward(self.logits[keep], None if self.top is None else self.top[keep],
                        None if self.lp is None else self.lp[keep])


@dataclass
class _Plan:
    """One row's step before its token is accepted: a draw, a token the thinking budget forces, or an error."""

    draw: Draw | None = None
    forced: int | None = None
    error: str | None = None


def _plan(seq: RequestRun, logits: mx.array, argmax: mx.array | None, logprobs: mx.array | None) -> _Plan:
    """A row's sampling failure is that row's alone."""
    try:
        forced = seq.forced_next()
        return _Plan(None, forced) if forced is not None else _Plan(seq.draw(logits, argmax, logprobs))
    except Exception as e:
        log.exception("sampling failed for %s", seq.req.request_id)
        return _Plan(error=describe(e))


def _inputs(plans: list[_Plan]) -> mx.array:
    """The next forward pass's tokens: each row's draw, still on the device, or the token forced on it."""
    return mx.concatenate([p.draw.token.reshape(1, 1).astype(mx.int32) if p.draw is not None
                           else mx.array([[p.forced]], dtype=mx.int32) for p in plans])


def _accept(seq: RequestRun, plan: _Plan) -> bool:
    """Detokenizing, stop strings and grammar run per row: a failure there ends that row only."""
    if plan.error is not None:
        return seq.finish("error", error=plan.error)
    return seq.accept_guarded(plan.draw, plan.forced)


def _log_softmax(logits: mx.array) -> mx.array:
    """Every row's log-softmax in one op, started now: the sampled rows read theirs on the host, and one
    evaluation serves them all (each row's is the one it computes alone, to the bit)."""
    logits = logits.astype(mx.float32)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    mx.async_eval(lp)
    return lp


class BatchDecoder:
    def __init__(self, model: Any, speculator: Speculator | None = None, prims: Primitives = MLX_OPS) -> None:
        self.model, self.speculator, self._prims = model, speculator, prims  # prims: the model's (its argmax)
        self.rows: list[RequestRun] = []
        self._cache: list[Any] = []
        self._ahead: _Forward | None = None  # the next forward pass, queued on this step's tokens still on the device
        self.last_tokens = 1  # tokens the last step gave each row (a speculative round gives several)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def settled(self) -> bool:
        """No step is queued ahead: a row may join (a queued step has no row for it)."""
        return self._ahead is None

    def add(self, seq: RequestRun) -> None:
        assert seq.cache is not None and seq.prefilled
        if not self.settled:
            raise RuntimeError("a row joins only between settled steps")
        merged = [_as_batch(c) for c in seq.cache]
        if not self.rows:
            self._cache = merged
        else:
            for mine, theirs in zip(self._cache, merged, strict=True):
                mine.extend(theirs)
        seq.cache = None  # the batch owns its KV now
        self.rows.append(seq)

    def step(self, ahead: bool = False) -> None:
        """One token for every row; rows that finish, or fail on their own, leave the batch.

        `ahead`: no row will join before the next step, so the next forward pass may be queued now on this
        step's tokens while they are still on the device, and its graph built while this one computes (the
        host's share of a step, about a quarter of it on a small model). Each row still draws at its own step,
        after its last token was accepted: a grammar's mask, a forced token and the penalties' history see
        the settled loop's state. A failure of the shared forward pass escapes: no row can be blamed for it,
        so the caller recovers."""
        fwd, self._ahead = self._ahead, None
        if fwd is None:
            if self._speculate():
                return
            fwd = self._forward(mx.array([[s.next_input] for s in self.rows], dtype=mx.int32))
            if any(s.constraint is not None for s in self.rows):
                mx.async_eval(fwd.logits)  # the forward pass runs while the rows' grammars compute their masks
        self.last_tokens = 1
        plans = [_plan(s, fwd.logits[i: i + 1], fwd.top[i: i + 1] if fwd.top is not None else None,
                       fwd.lp[i: i + 1] if fwd.lp is not None else None) for i, s in enumerate(self.rows)]
        if ahead and self._queues_ahead(plans):
            # the draws first, as outputs of their own: waiting for them must not wait for the pass queued next
            mx.async_eval([p.draw.token for p in plans if p.draw is not None])
            self._ahead = self._forward(_inputs(plans))
            mx.async_eval(self._ahead.arrays())  # a queued pass runs while the next step's grammars mask too
        self._evaluate(plans)
        done = [_accept(s, p) for s, p in zip(self.rows, plans, strict=True)]
        self._drop([i for i, d in enumerate(done) if d])

    def _forward(self, tokens: mx.array) -> _Forward:
        logits = self.model(tokens, cache=self._cache).logits[:, -1, :]
        top = self._prims.argmax(logits) if any(s.bulk_greedy for s in self.rows) else None
        lp = _log_softmax(logits) if any(s.sampler.reads_logprobs for s in self.rows) else None
        return _Forward(logits, top, lp)

    def _queues_ahead(self, plans: list[_Plan]) -> bool:
        """Every row has a next token to feed and goes on past it, and no speculative round is due."""
        spec = self.speculator
        if spec is not None and len(self.rows) == 1 and spec.eligible(self.rows[0]):
            return False
        return all(p.error is None and s.queues_ahead for s, p in zip(self.rows, plans, strict=True))

    def _speculate(self) -> bool:
        """A round when one row decodes alone and may speculate; False when the plain step should run."""
        spec = self.speculator
        if spec is None or len(self.rows) != 1 or not spec.eligible(seq := self.rows[0]):
            return False
        before = seq.stream.generated
        finished = spec.round(seq, self.model, self._cache)
        if finished is None:
            return False
        self.last_tokens = max(1, seq.stream.generated - before)
        if finished:
            self._drop([0])
        return True

    def _evaluate(self, plans: list[_Plan]) -> None:
        """Evaluate the sampled tokens together. If that fails and the forward pass alone succeeds, evaluate
        row by row so that only the rows at fault fail; a failing forward pass escapes to the caller."""
        pending = [p.draw.token for p in plans if p.draw is not None]
        try:
            mx.eval(pending if pending else [c.state for c in self._cache])
            return
        except Exception:
            if not pending:
                raise
        mx.eval([c.state for c in self._cache])
        for p in plans:
            if p.draw is not None:
                try:
                    mx.eval(p.draw.token)
                except Exception as e:
                    p.error, p.draw = describe(e), None

    def take_all(self) -> list[RequestRun]:
        """Empty the batch (its KV is suspect after a failed step) and hand back its rows."""
        rows, self.rows, self._cache, self._ahead = self.rows, [], [], None
        return rows

    def cancel_requested(self) -> None:
        """Rows whose client went away leave now, not at their next token."""
        gone = [i for i, s in enumerate(self.rows) if s.cancelled()]
        for i in gone:
            self.rows[i].finish("cancelled")
        self._drop(gone)

    def shed(self, index: int, error: str) -> None:
        self.rows[index].finish("shed", error=error)
        self._drop([index])

    def _drop(self, indices: list[int]) -> None:
        if not indices:
            return
        keep = [i for i in range(len(self.rows)) if i not in set(indices)]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self._cache, self._ahead = [], None
            return
        idx = mx.array(keep, dtype=mx.int32)
        if self._ahead is not None:  # the queued pass's KV for the leaving rows goes with the filter below
            self._ahead = self._ahead.rows(idx)
        for c in self._cache:
            c.filter(idx)
