"""The model host: model ids -> engines, created lazily through an injected factory, several at once.

Loads pass the Hugging Face policy and the load gate, one at a time (one lock); unloads happen on /unload,
on the idle sweep and to make room for a load. Also the /v1/models listing and the /health readiness
verdict, both read without waiting on an engine (stats() is a snapshot; GGUF headers are read off the loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gmlx_server.config import ModelEntry, RuntimeEnv, ServerConfig
from gmlx_server.engine.types import (
    Engine,
    EngineClosed,
    GenerationRequest,
    RequestHandle,
    TokenEvent,
    check_engine,
)
from gmlx_server.errors import EngineRestarting, GmlxError, ModelNotFound
from gmlx_server.serving.addressing import Catalog, resolve_address
from gmlx_server.serving.admission import Admission
from gmlx_server.serving.cache_points import TokenMemo
from gmlx_server.serving.cache_stats import CacheReset, clear_disk
from gmlx_server.serving.capacity import CapacityService
from gmlx_server.serving.drain import DEFAULT_DRAIN_S, Drain
from gmlx_server.serving.fair_share import FairShares
from gmlx_server.serving.governor import Governor
from gmlx_server.serving.hf_policy import local_entry
from gmlx_server.serving.load_gate import HeldWeights, LoadGate
from gmlx_server.serving.memory_probes import MemoryReading, read_memory
from gmlx_server.serving.model_files import ModelFiles, ModelLoadFailed
from gmlx_server.serving.model_list import ModelList
from gmlx_server.serving.readiness import Readiness, readiness_of
from gmlx_server.serving.reload import ModelChanges, diff_models, rebuild_capacity
from gmlx_server.serving.residency import Residency, close_engine, release_memory, streaming, warm_up
from gmlx_server.serving.supervisor import Supervisor
from gmlx_server.serving.telemetry import Telemetry

EngineFactory = Callable[[ModelEntry, RuntimeEnv], Engine]
log = logging.getLogger("gmlx.host")


def default_engine_factory(entry: ModelEntry, env: RuntimeEnv) -> Engine:
    """The MLX engine, imported on first use so that importing the app stays cheap."""
    from gmlx_server.engine.factory import create_engine

    engine: Engine = create_engine(entry, env)
    return engine


__all__ = ["ModelBusy", "ModelHost", "ModelLoadFailed", "Readiness"]


class ModelBusy(GmlxError):
    status, type = 409, "model_busy"


class ModelHost:
    def __init__(self, config: ServerConfig, engine_factory: EngineFactory | None = None,
                 clock: Callable[[], float] = time.monotonic, *, check_headers: bool = True,
                 drain_deadline_s: float = DEFAULT_DRAIN_S) -> None:
        """`check_headers` off only for engines whose entries name no real file (a test's fakes);
        `drain_deadline_s` is SIGTERM's grace (gmlx serve --drain-timeout)."""
        self.config = config
        self.catalog = Catalog.from_config(config)
        self._factory = engine_factory or default_engine_factory
        self._engines: dict[str, Engine] = {}
        self._load_lock = asyncio.Lock()  # loads, unloads and reloads, one at a time: the gate's view holds
        self.telemetry = Telemetry()
        self.token_memo = TokenMemo()  # the prompt cache's anchor probes, per host
        self.admission = Admission(config.env, self.telemetry)
        self.shares = FairShares()  # each caller's slots (server.fair_share, api_keys[].max_concurrent)
        self.governor = Governor(config.env.governor, self._read_memory)
        self.capacity = CapacityService(config)
        self.residency = Residency(clock)
        self.supervisor = Supervisor(clock)
        self.drain = Drain(clock, drain_deadline_s)  # SIGTERM's graceful stop (gmlx serve begins it)
        self.gate = LoadGate(self)  # real time: its 3 s wait is wall-clock
        self.held = HeldWeights()  # the service models' weights, which the services write and the gate counts
        self.listing = ModelList(self)
        self.files = ModelFiles(check_headers=check_headers)
        default = self.default_id()
        self.verify_files([self.entry(default)] if default is not None else [])  # so ready=1 knows at boot

    def _read_memory(self) -> MemoryReading:
        # MLX's allocator is process-wide: each engine's snapshot measures all of it, so summing them would count
        # every byte once per resident engine. The largest is the most complete (roughly the latest).
        snaps = [e.memory for e in self._engines.values() if e.memory is not None]
        latest = [max(snaps, key=lambda m: int(m.active_bytes))] if snaps else []
        return read_memory(self.config.server.memory_budget, latest)

    @property
    def env(self) -> RuntimeEnv:
        return self.config.env

    def entry(self, model_id: str) -> ModelEntry:
        entry = self.config.models.get(model_id)
        if entry is None:
            raise ModelNotFound(model_id, self.catalog.model_ids)
        return entry

    @property
    def resident(self) -> Mapping[str, Engine]:
        return dict(self._engines)

    def prefill_progress(self, model_id: str, request_id: str) -> tuple[int, int] | None:
        """(prompt tokens in the cache, prompt tokens) while the request prefills; None otherwise."""
        engine = self._engines.get(model_id)
        row = next((r for r in engine.stats().rows if r.request_id == request_id), None) if engine else None
        return (row.prefilled, row.prompt_tokens) if row is not None and row.state == "prefill" else None

    async def engine(self, model_id: str) -> Engine:
        """The model's engine, loading it on first use (one load at a time, each behind the load gate)."""
        engine = self._engines.get(model_id)
        if (engine is not None and engine.fault is not None) or self.supervisor.outage(model_id) is not None:
            await self.supervise()
            self._refuse_while_down(model_id)
            engine = self._engines.get(model_id)
        if engine is None or self.residency.state(model_id).stale:
            entry = self.entry(model_id)
            async with self._load_lock:
                engine = await self._current(entry)
        self.residency.touch(model_id)
        return engine

    async def _current(self, entry: ModelEntry) -> Engine:
        """Under the load lock: the resident engine, unless a reload changed its entry and it is idle."""
        engine = self._engines.get(entry.id)
        if engine is not None and self.residency.state(entry.id).stale and not streaming(engine):
            await self.evict(entry.id)
            engine = None
        return engine if engine is not None else await self._load(entry)

    async def _load(self, entry: ModelEntry) -> Engine:
        local = local_entry(entry, self.config)  # 403 before any memory is judged or freed
        await asyncio.to_thread(self.files.verify, local)  # a known-bad or bad-header file: 503 before the gate
        need = await self._need(entry.id)
        if need is not None and not self.env.overcommit:
            await self.gate.admit(entry.id, need)
        log.info("loading model %s from %s", entry.id, local.path)
        try:
            # The factory may block while the engine's own thread loads weights; keep the loop free.
            engine = await asyncio.to_thread(self._factory, local, self.env)
        except GmlxError:
            raise
        except Exception as exc:
            raise self.files.load_failed(local, exc) from exc
        try:
            check_engine(engine)  # an incomplete engine is a bug: fail loudly now, not on its first use
        except TypeError:
            await asyncio.to_thread(close_engine, entry.id, engine)
            raise
        self._engines[entry.id] = engine
        self.residency.loaded(entry.id, engine.info.weights_bytes)
        await asyncio.to_thread(release_memory)  # the load's transients, back to the OS
        return engine

    async def _need(self, model_id: str) -> int | None:
        """The weights a load will add: as last loaded, else the planner's figure from the GGUF header."""
        known = self.residency.state(model_id).weights_bytes
        if known is not None:
            return known
        mm = await asyncio.to_thread(self.capacity.memory_model, model_id)
        return mm.weights_bytes if mm is not None else None

    # --- supervision: an engine whose thread died is unloaded now and loaded again after a backoff ---

    def start(self, model_id: str, engine: Engine, request: GenerationRequest,
              on_final: Callable[[TokenEvent], None] | None = None) -> RequestHandle:
        """admit -> submit -> track: the one way a generation reaches an engine (the queue cap's 503 first, with
        no await between it and the submit; its final event reaches telemetry and `on_final`)."""
        self.admission.admit(model_id, engine.stats())
        return self.telemetry.track(model_id, self.submit(model_id, engine, request), on_final)

    def submit(self, model_id: str, engine: Engine, request: GenerationRequest) -> RequestHandle:
        """Hand a request to the engine; one that died since it was handed out answers a typed 503."""
        try:
            return engine.submit(request)
        except EngineClosed as exc:
            raise EngineRestarting(model_id, str(exc), max(1.0, self.supervisor.wait_s(model_id))) from None

    def _refuse_while_down(self, model_id: str) -> None:
        outage = self.supervisor.outage(model_id)
        if outage is not None:
            raise EngineRestarting(model_id, outage.reason, self.supervisor.wait_s(model_id))

    async def supervise(self) -> None:
        """Unload engines that died (their requests end with an error) and restart those whose backoff is over."""
        for model_id, engine in list(self._engines.items()):
            reason = engine.fault
            if reason is None:
                continue
            async with self._load_lock:
                if self._engines.get(model_id) is not engine:
                    continue  # a concurrent supervise() got there first
                wait = self.supervisor.died(model_id, reason)
                log.error("the engine of model %s stopped (%s); restarting it in %.0f s", model_id, reason, wait)
                await self.evict(model_id)
        for model_id in self.supervisor.due():
            await self._restart(model_id)

    async def _restart(self, model_id: str) -> None:
        entry = self.config.models.get(model_id)
        if entry is None:  # a reload removed it meanwhile
            self.supervisor.forget(model_id)
            return
        try:
            async with self._load_lock:
                if model_id not in self._engines:
                    await self._load(entry)
        except Exception as exc:
            wait = self.supervisor.died(model_id, f"restart failed: {exc}")
            log.error("restarting model %s failed (%s); next try in %.0f s", model_id, exc, wait)
            return
        self.supervisor.up(model_id)
        log.info("the engine of model %s is serving again", model_id)

    # --- residency: what the load gate reads, and the unloads -------------------------------------

    def is_pinned(self, model_id: str) -> bool:
        entry = self.config.models.get(model_id)
        return entry is not None and entry.pinned

    def weights_of(self, model_id: str) -> int:
        return self._engines[model_id].info.weights_bytes

    def held_elsewhere(self) -> Mapping[str, int]:
        return self.held.snapshot()

    def drain_eta_s(self, model_ids: Iterable[str]) -> float | None:
        etas = [self.admission.eta_s(m, self._engines[m].stats()) for m in model_ids if m in self._engines]
        return max(etas) if etas else None

    def marks(self, model_id: str) -> dict[str, object]:
        """resident_models[] markers: pinned (config), kept (/v1/keep), how often the model loaded and how often
        its engine died."""
        return {"pinned": self.is_pinned(model_id), **self.residency.marks(model_id),
                "restarts": self.supervisor.restarts.get(model_id, 0), "lifetime": self.lifetime(model_id)}

    def lifetime(self, model_id: str) -> dict[str, object] | None:
        """A resident model's lifetime: what sets it, its length and the seconds left (None: not resident)."""
        engine = self._engines.get(model_id)
        if engine is None:
            return None
        return self.residency.lifetime(model_id, streaming(engine), self.is_pinned(model_id),
                                       self.config.server.idle_timeout_s)

    async def evict(self, model_id: str, explicit: bool = False) -> None:
        """Unload now; the caller holds the load lock and has checked that the model is not streaming."""
        engine = self._engines.pop(model_id, None)
        if engine is None:
            return
        self.residency.unloaded(model_id, explicit)
        log.info("unloading model %s%s", model_id, "" if explicit else " (idle or evicted for room)")
        await asyncio.to_thread(close_engine, model_id, engine)
        del engine  # the last reference: release_memory can free the arrays
        await asyncio.to_thread(release_memory)

    async def unload(self, model_id: str) -> bool:
        """/unload {"model": id}: pinned ones too. False when it was not resident; 409 while it streams."""
        await self._settle([model_id])
        async with self._load_lock:
            engine = self._engines.get(model_id)
            if engine is None:
                return False
            if streaming(engine):
                s = engine.stats()
                raise ModelBusy(f"model '{model_id}' is streaming ({s.in_flight} in flight, {s.waiting} waiting); "
                                "unload it when its requests finish", param="model")
            await self.evict(model_id, explicit=True)
        return True

    async def unload_idle(self) -> tuple[list[str], list[str]]:
        """/unload with no model: every resident model that is not streaming. (unloaded, still busy)."""
        await self._settle(list(self._engines))
        async with self._load_lock:
            busy = [m for m, e in self._engines.items() if streaming(e)]
            idle = [m for m in self._engines if m not in busy]
            for model_id in idle:
                await self.evict(model_id, explicit=True)
        return idle, busy

    async def _settle(self, model_ids: list[str]) -> None:
        """An explicit unload first waits out the handout grace: a request that was just given the engine may
        not have submitted yet, and would wait forever on a closed one."""
        left = max((self.residency.grace_left(m) for m in model_ids), default=0.0)
        if left > 0:
            await asyncio.sleep(left)

    async def sweep(self) -> list[str]:
        """The periodic idle task: unload models idle past their lifetime, and stale ones once idle."""
        if self._load_lock.locked():
            return []  # a load or unload is under way: next tick
        async with self._load_lock:
            due = self.residency.expired(self._engines, self.is_pinned, self.config.server.idle_timeout_s)
            for model_id in due:
                await self.evict(model_id)
        return due

    async def keep(self, model_id: str, keep: bool = True, warm: bool = True,
                   keep_alive_s: float | None = None) -> dict[str, Any]:
        """/v1/keep: load if needed and warm; keep=False only releases (the lifetime counts from now). A
        keep_alive sets the lifetime, as a request's does; 0 loads nothing, and the model unloads once idle."""
        state = self.residency.state(model_id)
        warm_s = None
        if keep or keep_alive_s:
            engine = await self.engine(model_id)
            state.kept = keep
            if keep_alive_s is not None:
                self.residency.keep_alive(model_id, keep_alive_s)
            try:
                warm_s = round(await warm_up(engine), 3) if warm else None
            except EngineClosed as exc:  # it died since it was handed out: the supervisor restarts it
                raise EngineRestarting(model_id, str(exc), max(1.0, self.supervisor.wait_s(model_id))) from None
        else:
            state.kept = False
            self.residency.touch(model_id)
            if keep_alive_s is not None and model_id in self._engines:
                self.residency.keep_alive(model_id, keep_alive_s)
        return {"model": model_id, "kept": state.kept, "resident": model_id in self._engines,
                "warm_s": warm_s, "loads": state.loads, "lifetime": self.lifetime(model_id)}

    async def reconfigure(self, config: ServerConfig) -> ModelChanges:
        """Swap in a re-read config (POST /v1/reload). Engines of unchanged entries stay loaded; changed or
        removed ones unload now if idle, else once their requests finish (until then they serve them)."""
        async with self._load_lock:
            changes = diff_models(self.config.models, config.models)
            self.capacity = rebuild_capacity(self.capacity, self.config, config)
            self.config, self.catalog = config, Catalog.from_config(config)
            self.files.forget((*changes.changed, *changes.removed))  # a new entry gets a new verdict
            for model_id in (*changes.changed, *changes.removed):
                self.listing.forget(model_id)
                self.residency.retire(model_id, resident=model_id in self._engines)
            for model_id in self.residency.expired(self._engines, self.is_pinned, 0.0):
                await self.evict(model_id)
            self.residency.forget(set(config.models) | set(self._engines))
        return changes

    def reset_cache(self, model_id: str | None = None, ram: bool = True, disk: bool = True) -> CacheReset:
        """/v1/cache/reset: the RAM tiers of every resident model (or of one), and the disk tier's files of every
        model (or of one, resident or not)."""
        reset = ([m for m, e in self.resident.items() if (model_id is None or m == model_id) and e.reset_cache()]
                 if ram else [])
        return CacheReset(reset, clear_disk(self.config.server, model_id) if disk else None)

    def capacity_section(self) -> dict[str, Any] | None:
        """The boot capacity table for /v1/metrics; None without one (no readable GGUF default model)."""
        return self.capacity.section()

    def close(self) -> None:
        engines, self._engines = self._engines, {}
        for model_id, engine in engines.items():
            try:
                engine.close()
            except Exception:
                log.exception("closing engine %s failed", model_id)

    # --- /v1/models and /health?ready=1 ----------------------------------------------------------

    async def list_models(self) -> list[dict[str, Any]]:
        """Configured and discovered ids, then alias presets, each with its markers."""
        return await self.listing.rows()

    def verify_files(self, entries: Iterable[ModelEntry]) -> None:
        """Header verdicts, remembered (blocking: a stat per model once its file is judged)."""
        for entry in entries:
            with contextlib.suppress(GmlxError):  # a bad file is remembered; a repo id stays the loader's 403
                self.files.verify(local_entry(entry, self.config))

    def default_id(self) -> str | None:
        try:
            return resolve_address("", None, self.catalog).model_id
        except GmlxError:
            return None

    def readiness(self) -> Readiness:
        """Coarse verdict for a load balancer: see serving/readiness.py."""
        return readiness_of(self)
