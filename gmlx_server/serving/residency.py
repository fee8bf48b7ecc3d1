"""Residency bookkeeping: when each model was last used, whether it is kept, how long it stays after its last
request, how often it loaded, and which resident models may be unloaded (its lifetime, LRU eviction under
memory pressure).

A model's lifetime is the latest keep_alive (or ttl) a request or /v1/keep gave it, else server.idle_timeout_s;
it counts from the end of the model's last request, a request without one leaves it as it stands, and an unload
forgets it. Pinned and kept models outlive any lifetime; memory pressure may evict any idle unpinned model.

Pure bookkeeping over the resident engines' stats(); the host owns the engines and does the unloading.
"""

from __future__ import annotations

import ctypes
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gmlx_server.engine.types import Engine, GenerationRequest, SamplingParams

# A model handed to a request this recently may not have submitted yet (rendering, tokenizing): not evictable.
HANDOUT_GRACE_S = 2.0
log = logging.getLogger("gmlx.residency")


@dataclass
class ModelState:
    last_used: float = 0.0  # last handed to a request, or last seen streaming
    kept: bool = False  # /v1/keep: survives the idle timeout (never memory pressure)
    loads: int = 0
    weights_bytes: int | None = None  # ModelInfo.weights_bytes of the last load
    stale: bool = False  # a reload changed or removed it: unload once idle
    keep_alive_s: float | None = None  # the latest request's keep_alive (inf: no end); None: the idle timeout


@dataclass(frozen=True)
class Classes:
    """Resident models by what the load gate may do with them; `evictable` is least recently used first."""

    held: list[str] = field(default_factory=list)  # pinned or streaming: never evicted for another model
    settling: list[str] = field(default_factory=list)  # just handed out: wait for it
    evictable: list[str] = field(default_factory=list)


def streaming(engine: Engine) -> bool:
    s = engine.stats()
    return s.in_flight + s.waiting > 0


class Residency:
    def __init__(self, clock: Callable[[], float] = time.monotonic, grace_s: float = HANDOUT_GRACE_S) -> None:
        self.clock, self.grace_s = clock, grace_s
        self._models: dict[str, ModelState] = {}

    def state(self, model_id: str) -> ModelState:
        return self._models.setdefault(model_id, ModelState(last_used=self.clock()))

    def touch(self, model_id: str) -> None:
        self.state(model_id).last_used = self.clock()

    def grace_left(self, model_id: str) -> float:
        """Seconds until a model last handed to a request counts as idle (0 for one never used)."""
        s = self._models.get(model_id)
        return max(0.0, s.last_used + self.grace_s - self.clock()) if s is not None else 0.0

    def loaded(self, model_id: str, weights_bytes: int) -> None:
        s = self.state(model_id)
        s.loads, s.weights_bytes, s.stale, s.last_used = s.loads + 1, weights_bytes, False, self.clock()

    def unloaded(self, model_id: str, explicit: bool) -> None:
        """An explicit /unload ends a keep; an eviction under pressure does not (nor is a pin ever lost)."""
        s = self.state(model_id)
        s.stale, s.keep_alive_s = False, None  # a fresh load starts with the server's idle timeout
        s.kept = s.kept and not explicit

    def keep_alive(self, model_id: str, seconds: float) -> None:
        """A request's keep_alive or ttl: the model's lifetime from now on (0: unload once its requests end)."""
        self.state(model_id).keep_alive_s = seconds

    def lifetime_s(self, model_id: str, timeout_s: float) -> float:
        """Seconds the model stays after its last request: the latest keep_alive, else the idle timeout (0: never
        unloaded, inf)."""
        life = self.state(model_id).keep_alive_s
        return life if life is not None else timeout_s if timeout_s > 0 else math.inf

    def lifetime(self, model_id: str, busy: bool, pinned: bool, timeout_s: float) -> dict[str, object]:
        """What sets a resident model's lifetime, its length (null: no end) and the seconds left; while the model
        streams, the whole length: the countdown starts when its last request ends."""
        s = self.state(model_id)
        source = ("pinned" if pinned else "kept" if s.kept else
                  "request" if s.keep_alive_s is not None else "idle_timeout")
        life = math.inf if source in ("pinned", "kept") else self.lifetime_s(model_id, timeout_s)
        if math.isinf(life):
            return {"source": source, "keep_alive_s": None, "expires_in_s": None}
        left = life if busy else max(0.0, s.last_used + max(life, self.grace_s) - self.clock())
        return {"source": source, "keep_alive_s": life, "expires_in_s": round(left, 1)}

    def retire(self, model_id: str, resident: bool) -> None:
        """A reload changed or removed the entry: its remembered weights no longer hold; a resident engine
        becomes stale (unloaded once idle, pinned or not)."""
        s = self.state(model_id)
        s.weights_bytes, s.stale = None, resident

    def forget(self, keep: set[str]) -> None:
        """Drop the state of models a reload removed (their loads restart at zero if they return)."""
        for model_id in set(self._models) - keep:
            del self._models[model_id]

    def marks(self, model_id: str) -> dict[str, object]:
        s = self.state(model_id)
        return {"kept": s.kept, "loads": s.loads}

    def classify(self, engines: Mapping[str, Engine], pinned: Callable[[str], bool]) -> Classes:
        """Held, settling and evictable resident models. Streaming ones are touched: idle counts from their end."""
        out = Classes()
        now = self.clock()
        for model_id, engine in engines.items():
            if streaming(engine):
                self.touch(model_id)
                out.held.append(model_id)
            elif pinned(model_id) and not self.state(model_id).stale:
                out.held.append(model_id)
            elif now - self.state(model_id).last_used < self.grace_s:
                out.settling.append(model_id)
            else:
                out.evictable.append(model_id)
        out.evictable.sort(key=lambda m: self.state(m).last_used)
        return out

    def expired(self, engines: Mapping[str, Engine], pinned: Callable[[str], bool], timeout_s: float) -> list[str]:
        """Models to unload now: stale ones once idle, and unpinned unkept ones idle past their lifetime (the
        idle timeout, 0 = never, unless a request set another)."""
        c = self.classify(engines, pinned)
        now = self.clock()

        def due(m: str) -> bool:
            s = self.state(m)
            idle_for = max(self.lifetime_s(m, timeout_s), self.grace_s)
            return s.stale or (not s.kept and now - s.last_used >= idle_for)

        return [m for m in c.evictable if due(m)]


async def warm_up(engine: Engine) -> float:
    """One greedy token through the engine (first-call compilation, caches); seconds it took."""
    t0 = time.perf_counter()
    tok = engine.tokenizer
    ids = tok.encode("Hello", True) or [tok.bos_id or 0]
    request = GenerationRequest(f"warmup-{uuid.uuid4().hex[:12]}", ids, max_tokens=1,
                                sampling=SamplingParams(temperature=0.0))
    async for _ in engine.submit(request):
        pass
    return time.perf_counter() - t0


def close_engine(model_id: str, engine: Engine) -> None:
    """Blocking (run off the event loop): the engine thread ends and its requests are cancelled."""
    try:
        engine.close()
    except Exception:
        log.exception("closing engine %s failed", model_id)


def release_memory() -> None:
    """Hand freed heap pages back to the OS (the model's arrays, a load's transients): glibc keeps them until
    asked, and RSS would stay hundreds of MB high. No gc.collect(): it holds the GIL, stalling the event loop,
    and a closed engine's arrays are freed by reference counting alone."""
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own symbols: glibc's, when it runs on glibc
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        return
    trim(0)
