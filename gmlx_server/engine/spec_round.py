"""Speculative rounds for a request that decodes alone (batch width 1): the drafter proposes k tokens, the
target scores them in one forward pass, speculative.py's rule keeps a prefix and adds one token of its own.

Above width 1 the batch decodes plainly (each weight read serves every row already; verdict_batched says
so). A request joins rounds only while nothing can change its next token's distribution outside the
logits: no grammar, penalty or bias (the service refuses those for a speculative model) and no thinking
budget (it forces tokens). The drafter keeps its own cache per request and catches up on the tokens it
has not seen (the prompt, or what was decoded while the batch was wider) one prefill chunk per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from gmlx_plan.memory import PREFILL_CHUNK
from gmlx_server.engine.cache_trim import trim, trim_room
from gmlx_server.engine.last_row import last_row_only
from gmlx_server.engine.sampling import Draw
from gmlx_server.engine.speculative import Verdict, accept_greedy, accept_sampled

if TYPE_CHECKING:
    from gmlx_server.engine.drafter import Drafter
    from gmlx_server.engine.request_run import RequestRun


@dataclass
class DraftRun:
    """A request's drafter state: its caches and how many of the request's tokens they hold."""

    cache: list[Any]
    held: int = 0


class Speculator:
    def __init__(self, drafter: Drafter, chunk: int = PREFILL_CHUNK) -> None:
        self.drafter, self.k, self.chunk = drafter, drafter.tokens, chunk

    @staticmethod
    def eligible(seq: RequestRun) -> bool:
        return seq.budget is None and seq.constraint is None and seq.sampler.plain

    def round(self, seq: RequestRun, model: Any, cache: list[Any]) -> bool | None:
        """One round for `seq` on the target's caches: True when the request finished, False when it goes
        on, None when no round could run (the drafter is catching up, or a window leaves no room to roll
        back) and the caller should take a plain step."""
        tokens = [*seq.req.prompt_tokens, *seq.output]
        run = self._run(seq)
        if not self._ready(run, tokens, cache):
            return None
        drafts, q = self._draft(seq, run, tokens)
        k = len(drafts)
        logits = model(mx.array([[tokens[-1], *drafts]], dtype=mx.int32), cache=cache).logits[0]
        verdict = self._verify(seq, drafts, logits, q)
        n = len(tokens)
        # target: the inputs through the last kept draft stay (the new token is next step's input)
        trim(cache, k - verdict.accepted)
        keep = min(run.held, n + verdict.accepted)
        trim(run.cache, run.held - keep)
        run.held = keep
        return self._emit(seq, verdict, logits, k)

    def _run(self, seq: RequestRun) -> DraftRun:
        if seq.draft is None:
            seq.draft = DraftRun(self.drafter.make_cache())
        run: DraftRun = seq.draft
        return run

    def _ready(self, run: DraftRun, tokens: list[int], cache: list[Any]) -> bool:
        """Catch the drafter up to all but the last `chunk` tokens; False while it is further behind than that,
        or when a round could not be rolled back or would pass the drafter's window."""
        behind = len(tokens) - run.held
        if behind > self.chunk:
            upto = run.held + self.chunk
            self.drafter.model(mx.array([tokens[run.held: upto]], dtype=mx.int32), cache=run.cache)
            mx.eval([c.state for c in run.cache])
            run.held = upto
            return False
        room, droom = trim_room(cache), trim_room(run.cache)
        return ((room is None or room >= self.k + 1) and (droom is None or droom >= behind + self.k - 1)
                and len(tokens) + self.k < self.drafter.context_length)

    def _draft(self, seq: RequestRun, run: DraftRun, tokens: list[int]) -> tuple[list[int], mx.array | None]:
        """k drafts from the drafter (built lazily, evaluated once), and their distributions when sampling."""
        sampler, greedy = seq.sampler, seq.sampler.params.greedy
        inp = mx.array([tokens[run.held:]], dtype=mx.int32)
        drafts: list[mx.array] = []
        dists: list[mx.array] = []
        for _ in range(self.k):
            with last_row_only(self.drafter.model):  # a catch-up feeds several tokens; one row is drafted from
                logits = self.drafter.model(inp, cache=run.cache).logits[:, -1, :]
            if greedy:
                d = mx.argmax(logits, axis=-1)
            else:
                dists.append(sampler.distribution(logits))
                d = mx.random.categorical(mx.log(dists[-1]), key=sampler.next_key())
            drafts.append(d)
            inp = d.reshape(1, 1).astype(mx.int32)
        q = mx.concatenate(dists, axis=0) if dists else None
        mx.eval(drafts, q) if q is not None else mx.eval(drafts)
        run.held = len(tokens) + self.k - 1  # the last draft is proposed, not fed
        return [int(d.item()) for d in drafts], q  # type: ignore[arg-type]

    @staticmethod
    def _verify(seq: RequestRun, drafts: list[int], logits: mx.array, q: mx.array | None) -> Verdict:
        if q is None:
            return accept_greedy(drafts, mx.argmax(logits, axis=-1).tolist())  # type: ignore[arg-type]
        width = min(logits.shape[-1], q.shape[-1])  # a drafter may pad its vocabulary past the shared tokens
        p = seq.sampler.distribution(logits[:, :width])
        return accept_sampled(drafts, p, q[:, :width], seq.sampler.next_key())

    @staticmethod
    def _emit(seq: RequestRun, verdict: Verdict, logits: mx.array, k: int) -> bool:
        """Accept the round's tokens one by one, as plain decoding would have: a stop ends it where it stands."""
        logprobs = logits - mx.logsumexp(logits.astype(mx.float32), axis=-1, keepdims=True)
        seq.count_round(k, verdict.accepted)
        for i, token in enumerate(verdict.tokens):
            if seq.accept_guarded(Draw(mx.array([token]), logprobs[i: i + 1])):
                return True
        return False
