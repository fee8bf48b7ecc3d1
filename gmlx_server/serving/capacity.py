"""The boot capacity table, the memory preflight, /v1/estimate and /v1/capacity/plan.

Every formula is gmlx_plan's (the offline planner's): the table is built from the GGUF header alone
at boot, for the default model, so `gmlx plan` on the same file and budget prints the same table.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from gmlx_plan.budget import default_budget
from gmlx_plan.capacity import CapacityTable, build_table, plan, table_to_json
from gmlx_plan.gguf_header import GGUFFormatError, read_header
from gmlx_plan.memory import KV_DTYPE_BYTES, KVQuant, MemoryModel, model_from_header, model_with_draft, need_bytes
from gmlx_server.config import ModelEntry, ServerConfig
from gmlx_server.engine.layout import choose_layout, kv_dtype
from gmlx_server.engine.vision.mmproj import tower_bytes
from gmlx_server.errors import GmlxError

log = logging.getLogger("gmlx.capacity")


class PromptTooBigForMemory(GmlxError):
    """The prompt cannot fit in memory even with nothing else running. Agents match the prefix."""

    status, type = 400, "invalid_request_error"

    def __init__(self, need: int, available: int, prompt_tokens: int, model: str) -> None:
        super().__init__(
            f"prompt is too long: {prompt_tokens} prompt tokens need an estimated {need} bytes of memory "
            f"for model '{model}', but only {available} bytes are available to requests",
            param="messages", code="prompt_exceeds_memory",
            extra={"prompt_tokens": prompt_tokens, "need_bytes": need, "available_bytes": available},
        )


@dataclass(frozen=True)
class BootTable:
    model_id: str
    memory: MemoryModel
    table: CapacityTable


def _kv_quant(entry: ModelEntry) -> KVQuant | None:
    return entry.kv_quant


def memory_model(entry: ModelEntry, native_kernels: bool = True) -> MemoryModel:
    """The planner's model of one GGUF entry, from its header; the layout and KV dtype the engine will choose. A
    speculative model's drafter (its weights, its unquantized KV) is part of it."""
    header = read_header(entry.path, strings=False)
    layout, _ = choose_layout(entry.weights, header=header)
    kv = KV_DTYPE_BYTES[kv_dtype(entry.kv_dtype, native_kernels)]
    m = model_from_header(header, layout, _kv_quant(entry), kv_dtype_bytes=kv)
    if entry.mmproj is not None:  # a vision model's tower loads beside its text weights
        m = replace(m, weights_bytes=m.weights_bytes + tower_bytes(entry.mmproj))
    d = entry.draft
    if d is None:
        return m
    draft_header = read_header(d.path, strings=False)
    draft_layout, _ = choose_layout(d.weights, header=draft_header)
    return model_with_draft(m, draft_header, draft_layout, d.model_id, d.tokens)


class CapacityService:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.overcommit = config.env.overcommit
        self._models: dict[str, MemoryModel | None] = {}
        self.boot = self._build_boot()

    def _default_entry(self) -> ModelEntry | None:
        models = self.config.models
        default = self.config.server.default_model
        if default is not None and default in models:
            return models[default]
        return next(iter(models.values())) if len(models) == 1 else None

    def _build_boot(self) -> BootTable | None:
        entry = self._default_entry()
        mm = self.memory_model(entry.id) if entry else None
        if entry is None or mm is None:
            return None
        budget = self.config.server.memory_budget or default_budget()
        table = build_table(mm, budget, model=entry.id, decode_batch=self.config.server.decode_batch,
                            max_kv_size=entry.max_kv_size)
        log.info("capacity table for %s: budget %d bytes, weights %d, max_ctx %s", entry.id, budget,
                 mm.weights_bytes, dict(table.max_ctx))
        return BootTable(entry.id, mm, table)

    def memory_model(self, model_id: str) -> MemoryModel | None:
        """None for a model whose header cannot be read (a non-GGUF path, a fake in tests)."""
        if model_id not in self._models:
            entry = self.config.models.get(model_id)
            try:
                native = self.config.env.native_kernels
                self._models[model_id] = memory_model(entry, native) if entry and entry.path.endswith(".gguf") else None
            except (GGUFFormatError, OSError, ValueError) as e:
                log.warning("no capacity model for %s: %s", model_id, e)
                self._models[model_id] = None
        return self._models[model_id]

    # --- what the routes read ----------------------------------------------------------------------

    def section(self) -> dict[str, Any] | None:
        return table_to_json(self.boot.table) if self.boot else None

    def max_context_at_width_1(self, model_id: str) -> int | None:
        if self.boot is None or self.overcommit or self.boot.model_id != model_id:
            return None
        return self.boot.table.max_ctx_at(1)

    def drained_bytes(self, model_id: str) -> int | None:
        """Memory left to requests when nothing else runs: the budget less the weights."""
        mm = self.memory_model(model_id)
        budget = self.boot.table.budget_bytes if self.boot else self.config.server.memory_budget
        return budget - mm.weights_bytes if mm is not None and budget is not None else None

    def need(self, model_id: str, prompt_tokens: int, max_tokens: int | None, warm: int = 0) -> int | None:
        mm = self.memory_model(model_id)
        return need_bytes(mm, prompt_tokens, max_tokens, warm) if mm is not None else None

    def preflight(self, model_id: str, prompt_tokens: int, max_tokens: int | None) -> None:
        """400 before any prefill when the prompt cannot fit in memory even on an idle server."""
        if not self.config.env.preflight_mem or self.overcommit:
            return
        need, drained = self.need(model_id, prompt_tokens, max_tokens), self.drained_bytes(model_id)
        if need is not None and drained is not None and need > drained:
            raise PromptTooBigForMemory(need, drained, prompt_tokens, model_id)

    def plan_ok(self, width: int, depth: int) -> tuple[bool | None, str | None]:
        if self.boot is None or self.overcommit:
            return None, None
        verdict = plan(self.boot.table, width, depth)
        return verdict.ok, verdict.reason
