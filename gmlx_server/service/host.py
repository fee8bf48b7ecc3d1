"""The model host: model ids -> engines, created lazily through an injected factory.

Also the /v1/models listing and the /health readiness verdict, both read without waiting on
an engine (stats() is a snapshot; GGUF headers are read off the loop and cached).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gmlx_plan.gguf_header import GGUFFormatError, read_header
from gmlx_server.config import ModelEntry, RuntimeEnv, ServerConfig
from gmlx_server.engine.types import Engine
from gmlx_server.errors import GmlxError, ModelNotFound
from gmlx_server.service.addressing import Catalog
from gmlx_server.service.admission import Admission
from gmlx_server.service.capacity import CapacityService
from gmlx_server.service.governor import Governor
from gmlx_server.service.memory import MemoryReading, read_memory
from gmlx_server.service.telemetry import Telemetry

EngineFactory = Callable[[ModelEntry, RuntimeEnv], Engine]
log = logging.getLogger("gmlx.host")


def default_engine_factory(entry: ModelEntry, env: RuntimeEnv) -> Engine:
    """The MLX engine, imported on first use so that importing the app stays cheap."""
    from gmlx_server.engine.factory import create_engine

    engine: Engine = create_engine(entry, env)
    return engine


class ModelLoadFailed(GmlxError):
    status, type = 500, "model_load_failed"


class ModelHost:
    def __init__(self, config: ServerConfig, engine_factory: EngineFactory | None = None) -> None:
        self.config = config
        self.catalog = Catalog.from_config(config)
        self._factory = engine_factory or default_engine_factory
        self._engines: dict[str, Engine] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._context: dict[str, int | None] = {}  # model id -> trained context length (GGUF header)
        self.telemetry = Telemetry()
        self.admission = Admission(config.env, self.telemetry)
        self.governor = Governor(config.env.governor, self._read_memory)
        self.capacity = CapacityService(config)

    def _read_memory(self) -> MemoryReading:
        snaps = [m for e in self._engines.values() if (m := getattr(e, "memory", None)) is not None]
        return read_memory(self.config.server.memory_budget, snaps)

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

    async def engine(self, model_id: str) -> Engine:
        """The model's engine, loading it on first use (one load per model even under concurrency)."""
        engine = self._engines.get(model_id)
        if engine is not None:
            return engine
        entry = self.entry(model_id)
        async with self._locks.setdefault(model_id, asyncio.Lock()):
            engine = self._engines.get(model_id)
            if engine is None:
                engine = await self._load(entry)
                self._engines[model_id] = engine
        return engine

    async def _load(self, entry: ModelEntry) -> Engine:
        log.info("loading model %s from %s", entry.id, entry.path)
        try:
            # The factory may block while the engine's own thread loads weights; keep the loop free.
            return await asyncio.to_thread(self._factory, entry, self.env)
        except GmlxError:
            raise
        except Exception as exc:
            log.exception("model %s failed to load", entry.id)
            raise ModelLoadFailed(f"model '{entry.id}' failed to load: {exc}") from exc

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

    # --- /v1/models ---------------------------------------------------------------------------

    def _trained_context(self, entry: ModelEntry) -> int | None:
        if entry.id not in self._context:
            value: int | None = None
            if entry.path.lower().endswith(".gguf"):
                try:
                    raw = read_header(entry.path).arch_value("context_length")
                    value = int(raw) if raw is not None else None
                except (GGUFFormatError, ValueError, TypeError):
                    log.warning("cannot read the GGUF header of %s", entry.path)
            self._context[entry.id] = value
        return self._context[entry.id]

    def _context_length(self, entry: ModelEntry) -> int | None:
        engine = self._engines.get(entry.id)
        if engine is not None:
            return engine.info.context_length
        trained = self._trained_context(entry)
        if trained is None or entry.max_kv_size is None:
            return trained
        return min(trained, entry.max_kv_size)

    async def list_models(self) -> list[dict[str, Any]]:
        """Configured and discovered ids, then alias presets, each with its markers."""
        known = self._context.keys() | self._engines.keys()
        missing = [e for e in self.config.models.values() if e.id not in known]
        if missing:
            await asyncio.to_thread(lambda: [self._trained_context(e) for e in missing])
        default = self.config.server.default_model
        rows = [self._model_row(e, default) for e in self.config.models.values()]
        rows += [self._alias_row(name, target, default) for name, target in self.config.aliases.items()]
        return rows

    def _model_row(self, entry: ModelEntry, default: str | None) -> dict[str, Any]:
        return {
            "id": entry.id, "object": "model", "created": 0, "owned_by": "gmlx",
            "resident": entry.id in self._engines, "pinned": entry.pinned,
            # Speculative decoding and vision are not built yet: false until they are.
            "speculative": False, "vlm": False,
            "profile": entry.profile, "default": entry.id == default or len(self.config.models) == 1,
            "discovered": entry.discovered,
            "context_length": self._context_length(entry),
            "max_context_at_width_1": self.capacity.max_context_at_width_1(entry.id),
        }

    def _alias_row(self, name: str, target: str, default: str | None) -> dict[str, Any]:
        mid, _, prof = target.rpartition("@") if target not in self.config.models else (target, "", "")
        row = self._model_row(self.config.models[mid], default)
        return {**row, "id": name, "alias_of": target, "profile": prof or row["profile"],
                "default": name == default, "discovered": False}

    # --- /health?ready=1 ----------------------------------------------------------------------

    def readiness(self) -> Readiness:
        """Coarse verdict: pressure (orange/red band), then queue (someone waits), then busy (no free slot)."""
        stats = [e.stats() for e in self._engines.values()]
        waiting = sum(s.waiting for s in stats)
        in_flight = sum(s.in_flight for s in stats)
        if self.governor.pressure:
            return Readiness(False, "pressure", 5, in_flight, waiting)
        if waiting > 0:
            return Readiness(False, "queue", 2, in_flight, waiting)
        if stats and all(s.in_flight >= s.decode_batch for s in stats):
            return Readiness(False, "busy", 1, in_flight, waiting)
        return Readiness(True, None, None, in_flight, waiting)


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str | None  # one word: pressure | queue | busy
    retry_after_s: int | None
    in_flight: int
    waiting: int
