"""Fan-out simulation: waves of subagents against one engine's admission, queue and batched decode.

A small heap-based discrete-event simulation that mirrors the engine loop of
gmlx_server/engine/scheduler.py: each iteration starts one waiting request's prefill when a decode
slot is free, runs one prefill chunk, then one batched decode step for every decoding stream.
Not on simpy: its event queue also holds process starts and think-time timeouts, so the run of decode
steps that stops at the next arrival would still need this heap of arrivals (a simpy port gave the same
results, 8% longer and twice as slow).

Model and assumptions (every time from gmlx_plan/pace.py's Paces: measured, or flat rates given):
  arrivals   wave k+1 starts think_s after the last request of wave k resolves; its `width`
             requests arrive uniformly spread over [0, spread_s) (seeded)
  admission  a request whose geometry fails (depth + output_tokens over max_ctx at width 1) gets
             400 and is final; one that would wait while `queue_cap` already wait gets 503 with
             Retry-After = clamp(ceil(drain ETA), 2, 60) s and retries after it (at most
             max_retries times, then it gave up); else it waits for a slot
  slots      min(decode_batch, the widest tabulated width whose max_ctx holds depth + output):
             memory limits concurrency before the governor would have to shed
  cache      the first shared_prefix tokens of every prompt are the same; once a request has finished its
             prefill (the prompt cache stores it), a later one restores them (at least one cache block, and
             one prompt token is always prefilled) at the restore pace, and prefills only the rest
  prefill    one request at a time, `prefill_chunk` cold tokens per iteration at the prefill pace of their
             depth (a + b * depth seconds a token)
  decode     a step of w streams takes the measured step time at width w (interpolated between measured
             widths; flat rates: w / A(w), A(w) = decode_tok_s * w ** batch_scaling), join_s more right after
             a row joined the batch, and leave_s more right after a row left it
  drain ETA  this same loop replayed from the state at that moment with no more arrivals (replay(): what the
             server's Retry-After, queue.eta_s and est_ttft_s compute)
  outputs    the first of output_tokens comes from prefill (TTFT), the rest from decode steps
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from gmlx_plan.memory import PREFILL_CHUNK
from gmlx_plan.pace import Paces, paces_from_rates, reusable
from gmlx_plan.queueing import Rates, retry_after_s


@dataclass(frozen=True)
class Workload:
    waves: int
    width: int
    depth: int  # prompt tokens per subagent
    output_tokens: int
    think_s: float = 0.0
    spread_s: float = 0.0
    seed: int = 0
    max_retries: int = 20
    shared_prefix: int = 0  # leading prompt tokens every subagent shares (system prompt, tools, a common task)


@dataclass(frozen=True)
class ServerSide:
    decode_batch: int
    queue_cap: int
    prefill_chunk: int = PREFILL_CHUNK
    slots: int | None = None  # memory-limited decode width; None = decode_batch
    geometry_ok: bool = True  # one request of depth + output_tokens fits; else every request gets 400
    prompt_cache: bool = True

    @property
    def width(self) -> int:
        return self.decode_batch if self.slots is None else max(0, min(self.slots, self.decode_batch))


@dataclass(frozen=True)
class Outcome:
    wave: int
    status: str  # completed | rejected_400 | gave_up
    first_arrival: float
    accepted: float | None
    started: float | None
    first_token: float | None
    done: float | None
    retry_afters: tuple[int, ...]  # one per 503
    warm_tokens: int = 0  # prompt tokens it restored from the prompt cache

    @property
    def queue_wait(self) -> float | None:
        return None if self.started is None or self.accepted is None else self.started - self.accepted

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.first_arrival


@dataclass(frozen=True)
class SimResult:
    outcomes: tuple[Outcome, ...]
    drain_s: float  # when the last request resolved
    wave_drain_s: tuple[float, ...]  # each wave: first arrival -> last resolution
    timeline: tuple[tuple[float, int, int], ...]  # (t, streams in prefill or decode, waiting)
    slots: int
    paces: Paces | None = None  # what the run computed its times with


@dataclass
class _Req:
    rid: int
    wave: int
    first_arrival: float
    prompt: int
    decode_left: int
    warm: int | None = None  # prompt tokens it restores; None: known when its prefill starts
    pos: int = 0  # prompt tokens in its cache so far
    decoded: int = 0  # tokens in its cache beyond the prompt
    restored: bool = False  # its warm tokens are back (it has started prefill)
    accepted: float | None = None
    started: float | None = None
    first_token: float | None = None
    done: float | None = None
    status: str = ""
    retry_afters: list[int] = field(default_factory=list)

    @property
    def prefill_left(self) -> int:
        return self.prompt - self.pos


@dataclass(frozen=True)
class Backlog:
    """An engine's state at one moment, for replay(): decode tokens left per running row, the row in prefill
    (prompt, tokens already in its cache, decode tokens after its first), and the queue (prompt, warm, decode)."""

    decoding: Sequence[float] = ()
    prefilling: tuple[int, int, int] | None = None
    waiting: Sequence[tuple[int, int, int]] = ()
    decoding_ctx: Sequence[int] = ()  # each decoding row's KV tokens now (none given: 0)


@dataclass(frozen=True)
class Replay:
    drain_s: float
    first_token_s: tuple[float, ...]  # per waiting row, in order


class _Sim:
    def __init__(self, work: Workload, server: ServerSide, paces: Paces) -> None:
        self.work, self.server, self.paces = work, server, paces
        self.rng = random.Random(work.seed)
        self.t = 0.0
        self.events: list[tuple[float, int, _Req]] = []
        self.waiting: deque[_Req] = deque()
        self.prefilling: _Req | None = None
        self.batch: list[_Req] = []
        self.reqs: list[_Req] = []
        self.open_in_wave: dict[int, int] = {}
        self.timeline: list[tuple[float, int, int]] = []
        self.cached = False  # a prompt with the shared prefix is in the prompt cache
        self.joined = False  # a row joined the batch since the last decode step
        self.left = False  # a row left the batch at the last decode step (the next one filters its caches)
        self._start_wave(0, 0.0)

    # arrivals and admission -------------------------------------------------------------
    def _start_wave(self, wave: int, at: float) -> None:
        if wave >= self.work.waves or self.work.width <= 0:
            return
        self.open_in_wave[wave] = self.work.width
        for _ in range(self.work.width):
            t = at + self.rng.uniform(0.0, self.work.spread_s) if self.work.spread_s > 0 else at
            r = _Req(len(self.reqs), wave, t, self.work.depth, max(0, self.work.output_tokens - 1))
            self.reqs.append(r)
            heapq.heappush(self.events, (t, r.rid, r))

    def _resolve(self, r: _Req, status: str, at: float) -> None:
        r.status, r.done = status, at
        if r.wave < 0:  # a replayed backlog's row: no wave follows it
            return
        self.open_in_wave[r.wave] -= 1
        if self.open_in_wave[r.wave] == 0:
            self._start_wave(r.wave + 1, at + self.work.think_s)

    def _in_engine(self) -> int:
        return len(self.batch) + (self.prefilling is not None)

    def backlog(self) -> Backlog:
        """What the server's stats would show now; a waiting row behind another prompt (prefilling or queued)
        expects the shared prefix warm, as the server's queued rows do (CacheTiers.expected)."""
        p = self.prefilling
        ahead = self.cached or p is not None
        return Backlog([float(r.decode_left) for r in self.batch], (p.prompt, p.pos, p.decode_left) if p else None,
                       [(r.prompt, self._warm(ahead or i > 0), r.decode_left) for i, r in enumerate(self.waiting)],
                       [r.prompt + r.decoded for r in self.batch])

    def _eta(self) -> float:
        return replay(self.backlog(), self.server, self.paces).drain_s

    def _arrive(self, r: _Req, at: float) -> None:
        if not self.server.geometry_ok or self.server.width == 0:
            self._resolve(r, "rejected_400", at)
            return
        slot_free = self._in_engine() + len(self.waiting) < self.server.width
        # as the server counts: only the requests beyond the free slots wait (the others are about to start)
        for_a_slot = len(self.waiting) - max(0, self.server.width - self._in_engine())
        if not slot_free and for_a_slot >= self.server.queue_cap:
            ra = retry_after_s(self._eta())
            r.retry_afters.append(ra)
            if len(r.retry_afters) > self.work.max_retries:
                self._resolve(r, "gave_up", at)
            else:
                heapq.heappush(self.events, (at + ra, r.rid, r))
            return
        r.accepted = at
        self.waiting.append(r)

    def _events_until(self, until: float) -> None:
        while self.events and self.events[0][0] <= until:
            at, _, r = heapq.heappop(self.events)
            self._arrive(r, at)
            self.timeline.append((at, self._in_engine(), len(self.waiting)))

    # the engine loop ---------------------------------------------------------------------
    def _warm(self, cached: bool | None = None) -> int:
        """What a request starting its prefill now restores: the shared prefix once one prompt is cached."""
        cached = self.server.prompt_cache and (self.cached if cached is None else cached)
        return reusable(self.work.shared_prefix, self.work.depth) if cached else 0

    def _iteration(self) -> None:
        if self.prefilling is None and self.waiting and len(self.batch) < self.server.width:
            self.prefilling = self.waiting.popleft()
            self.prefilling.started = self.t
        if self.prefilling is not None:
            self._prefill_chunk()
        if self.batch:
            self._decode_steps()

    def _prefill_chunk(self) -> None:
        r = self.prefilling
        assert r is not None
        dt = 0.0
        if not r.restored:  # the engine restores on the request's first prefill step
            r.warm = self._warm() if r.warm is None else r.warm
            r.pos, r.restored, dt = r.warm, True, self.paces.restore_s(r.warm)
        take = min(self.server.prefill_chunk, r.prefill_left)
        dt += self.paces.prefill.seconds(r.pos, r.pos + take)
        self._events_until(self.t + dt)
        self.t += dt
        r.pos += take
        if r.prefill_left == 0:
            r.first_token, self.prefilling = self.t, None
            self.cached = True  # the prompt cache stores a prompt once its prefill ends
            if r.decode_left == 0:
                self._resolve(r, "completed", self.t)
            else:
                self.batch.append(r)  # it joins this iteration's decode step, as the scheduler does
                self.joined = True

    def _decode_steps(self) -> None:
        ctx = sum(r.prompt + r.decoded for r in self.batch)
        step = self.paces.step(len(self.batch), ctx)
        k = min(r.decode_left for r in self.batch)
        if self.prefilling is not None or (self.waiting and len(self.batch) < self.server.width):
            k = 1  # a prefill interleaves with every step
        elif self.events:
            k = max(1, min(k, math.ceil((self.events[0][0] - self.t) / step)))  # stop at the next arrival
        if k > 1:  # the context grows a token a row a step: the steps' mean is the one at their middle
            step = self.paces.step(len(self.batch), ctx + len(self.batch) * (k - 1) / 2)
        dt = k * step + (self.paces.join_s if self.joined else 0.0) + (self.paces.leave_s if self.left else 0.0)
        self.joined = False
        self._events_until(self.t + dt)
        self.t += dt
        for r in self.batch:
            r.decode_left -= k
            r.decoded += k
        for r in [r for r in self.batch if r.decode_left <= 0]:
            self._resolve(r, "completed", self.t)
        kept = [r for r in self.batch if r.decode_left > 0]
        self.left, self.batch = 0 < len(kept) < len(self.batch), kept

    def run(self) -> None:
        while True:
            if self.prefilling is not None or self.batch or (self.waiting and self.server.width > 0):
                self._iteration()
            elif self.events:
                self.t = max(self.t, self.events[0][0])
                self._events_until(self.t)
            else:
                return
            self.timeline.append((self.t, self._in_engine(), len(self.waiting)))


def _paces(rates: Paces | Rates) -> Paces:
    if isinstance(rates, Rates):
        if rates.decode_tok_s <= 0 or rates.prefill_tok_s <= 0:
            raise ValueError("decode and prefill rates must be positive")
        return paces_from_rates(rates)
    return rates


def replay(backlog: Backlog, server: ServerSide, rates: Paces | Rates) -> Replay:
    """The engine loop run from `backlog` with no more arrivals: when it is empty, and when each waiting row
    gets its first token. The server's drain estimate (Retry-After) and est_ttft_s are this replay."""
    paces = _paces(rates)
    sim = _Sim(Workload(0, 0, 0, 0), server, paces)
    ctx = [*backlog.decoding_ctx, *[0] * (len(backlog.decoding) - len(backlog.decoding_ctx))]
    sim.batch = [_Req(-1, -1, 0.0, c, max(1, math.ceil(left)), restored=True)
                 for left, c in zip(backlog.decoding, ctx, strict=True)]
    if backlog.prefilling is not None:
        prompt, done, decode = backlog.prefilling
        sim.prefilling = _Req(-1, -1, 0.0, prompt, decode, pos=min(done, prompt - 1), restored=True)
    queued = [_Req(i, -1, 0.0, prompt, decode, warm) for i, (prompt, warm, decode) in enumerate(backlog.waiting)]
    sim.waiting.extend(queued)
    sim.run()
    return Replay(sim.t, tuple(r.first_token or 0.0 for r in queued))


def simulate(work: Workload, server: ServerSide, rates: Paces | Rates) -> SimResult:
    paces = _paces(rates)
    sim = _Sim(work, server, paces)
    sim.run()
    outs = tuple(Outcome(r.wave, r.status, r.first_arrival, r.accepted, r.started, r.first_token, r.done,
                         tuple(r.retry_afters), r.warm or 0) for r in sim.reqs)
    waves = []
    for w in range(work.waves):
        mine = [o for o in outs if o.wave == w]
        if mine:
            waves.append(max(o.done or 0.0 for o in mine) - min(o.first_arrival for o in mine))
    drain = max((o.done or 0.0 for o in outs), default=0.0)
    return SimResult(outs, drain, tuple(waves), tuple(sim.timeline), server.width, paces)
