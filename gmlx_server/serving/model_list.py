"""GET /v1/models: configured and discovered ids, then alias presets, each with its markers and the two
context figures (GGUF headers are read off the loop, once per model, and remembered)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gmlx_plan.capacity import kv_quant_json
from gmlx_plan.gguf_header import GGUFFormatError, read_header
from gmlx_plan.gguf_types import is_base_model
from gmlx_server.engine.dir_files import is_model_dir, trained_context
from gmlx_server.engine.dir_tokenizer import read_json
from gmlx_server.engine.vision.dir_vision import vision_family

if TYPE_CHECKING:
    from gmlx_server.config import ModelEntry, ServerConfig
    from gmlx_server.engine.types import Engine
    from gmlx_server.serving.capacity import CapacityService
    from gmlx_server.serving.model_files import ModelFiles

log = logging.getLogger("gmlx.host")


class ListHost(Protocol):
    """What the listing reads of the model host."""

    config: ServerConfig
    capacity: CapacityService
    files: ModelFiles

    @property
    def resident(self) -> Mapping[str, Engine]: ...

    def verify_files(self, entries: list[ModelEntry]) -> None: ...

    def lifetime(self, model_id: str) -> dict[str, object] | None: ...


class ModelList:
    def __init__(self, host: ListHost) -> None:
        self.host = host
        self._context: dict[str, int | None] = {}  # model id -> trained context length (GGUF header)
        self._base: dict[str, bool] = {}  # GGUF model ids -> whether it is a base model (the same header)
        self._vision: dict[str, bool] = {}  # model directories with a vision tower (their config.json)

    def forget(self, model_id: str) -> None:
        """A reload changed or removed the entry: read its header again when next listed."""
        self._context.pop(model_id, None)
        self._base.pop(model_id, None)
        self._vision.pop(model_id, None)

    async def rows(self) -> list[dict[str, Any]]:
        host = self.host
        missing = [e for e in host.config.models.values() if e.id not in self._context]  # a resident one's too
        if missing:
            await asyncio.to_thread(lambda: [self._trained_context(e) for e in missing])
        await asyncio.to_thread(host.verify_files, list(host.config.models.values()))
        default = host.config.server.default_model
        rows = [self._model_row(e, default) for e in host.config.models.values()]
        rows += [self._alias_row(name, target, default) for name, target in host.config.aliases.items()]
        return rows

    def _trained_context(self, entry: ModelEntry) -> int | None:
        if entry.id not in self._context:
            value: int | None = None
            if is_model_dir(entry.path):
                value = trained_context(entry.path)
            elif entry.path.lower().endswith(".gguf"):
                try:
                    header = read_header(entry.path, strings=False)  # the vocabulary is not needed here
                    raw = header.arch_value("context_length")
                    value = int(raw) if raw is not None else None
                    self._base[entry.id] = is_base_model(header.metadata)
                except (GGUFFormatError, ValueError, TypeError):
                    log.warning("cannot read the GGUF header of %s", entry.path)
            self._context[entry.id] = value
        return self._context[entry.id]

    def _context_length(self, entry: ModelEntry) -> int | None:
        engine = self.host.resident.get(entry.id)
        if engine is not None:
            return engine.info.context_length
        trained = self._trained_context(entry)
        if trained is None or entry.max_kv_size is None:
            return trained
        return min(trained, entry.max_kv_size)

    def _model_row(self, entry: ModelEntry, default: str | None) -> dict[str, Any]:
        host = self.host
        engine = host.resident.get(entry.id)
        # What the engine really built (per layer), so only a resident model with kv_quant configured has it; a
        # resident model says what its unquantized caches hold (kv_dtype resolved at load).
        kv: dict[str, Any] = {"kv_dtype": engine.info.kv_dtype} if engine else {}
        if engine and engine.info.kv_quant:
            kv["kv_quant"] = kv_quant_json(engine.info.kv_quant)
        return {
            "id": entry.id, "object": "model", "created": 0, "owned_by": "gmlx", "kind": "chat",
            "resident": entry.id in host.resident, "pinned": entry.pinned, "lifetime": host.lifetime(entry.id),
            "speculative": _speculative(entry, engine), "vlm": self._vlm(entry, engine),
            "profile": entry.profile, "default": entry.id == default or len(host.config.models) == 1,
            "discovered": entry.discovered,
            "context_length": self._context_length(entry),
            "default_max_tokens": host.config.default_max_tokens(entry.id),  # a cap-less request's output cap
            # a base model never ends a turn: only stop strings (its profile's) or the cap end its reply
            "base": self._base.get(entry.id), "stop": self._stop(entry.profile),
            "tool_prompt_budget": entry.tool_prompt_budget,  # past this share of the window, tools render compactly
            "max_context_at_width_1": host.capacity.max_context_at_width_1(entry.id),
            "load_error": host.files.problem(entry.id),  # why its file cannot load; null when none is known
        } | kv

    def _vlm(self, entry: ModelEntry, engine: Engine | None) -> bool:
        """A projector configured, a resident engine with images, or a directory whose config has a tower."""
        if entry.mmproj is not None or (engine is not None and engine.info.vision is not None):
            return True
        if is_model_dir(entry.path) and entry.id not in self._vision:
            self._vision[entry.id] = vision_family(read_json(Path(entry.path) / "config.json")) is not None
        return self._vision.get(entry.id, False)

    def _alias_row(self, name: str, target: str, default: str | None) -> dict[str, Any]:
        models = self.host.config.models
        mid, _, prof = target.rpartition("@") if target not in models else (target, "", "")
        row = self._model_row(models[mid], default)
        return {**row, "id": name, "alias_of": target, "profile": prof or row["profile"],
                "stop": self._stop(prof or row["profile"]), "default": name == default, "discovered": False}

    def _stop(self, profile: str | None) -> list[str]:
        """The stop strings a user profile adds to every request (built-in intents add none)."""
        user = self.host.config.profiles.get(profile) if profile else None
        return list(user.stop) if user is not None else []


def _speculative(entry: ModelEntry, engine: Engine | None) -> dict[str, Any] | bool:
    """False without a drafter (or when the resident engine runs none); else the drafter, its k and how the model
    batches: speculative rounds while it decodes one stream, plain batched decode above width 1."""
    d = entry.draft
    if d is None or (engine is not None and not engine.info.drafts):
        return False
    return {"draft": d.model_id, "draft_tokens": d.tokens, "verdict": "speculative", "verdict_batched": "plain"}
