"""POST /v1/reload: re-read the config file and re-register models, keeping engines whose load parameters
(ModelEntry.load_key) did not change. A broken file keeps the running config and says why, and so does a new
or changed model whose GGUF fails the header check: a reload never swaps a working model for a file that
cannot load (models found in models_dir are exempt: a download in progress must not block reloads).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gmlx_server.config import ConfigError, ModelEntry, ServerConfig, reload_config
from gmlx_server.errors import GmlxError
from gmlx_server.serving.capacity import CapacityService
from gmlx_server.serving.hf_policy import local_entry
from gmlx_server.serving.model_files import check_drafts, file_problem

if TYPE_CHECKING:  # the host calls into this module; only its type is needed here
    from gmlx_server.engine.types import Engine
    from gmlx_server.serving.model_files import ModelFiles


class ReloadHost(Protocol):
    """What /v1/reload needs of the model host: its config, its files' checks and its reconfigure verb."""

    config: ServerConfig
    files: ModelFiles

    @property
    def resident(self) -> Mapping[str, Engine]: ...

    async def reconfigure(self, config: ServerConfig) -> ModelChanges: ...


class InvalidConfig(GmlxError):
    status, type = 400, "invalid_config"


@dataclass(frozen=True)
class ModelChanges:
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]  # same id, different load parameters: a new engine on the next request
    unchanged: tuple[str, ...]  # profile, pinned and the like may differ: the engine stays


def diff_models(old: Mapping[str, ModelEntry], new: Mapping[str, ModelEntry]) -> ModelChanges:
    both = [m for m in new if m in old]
    return ModelChanges(
        added=tuple(m for m in new if m not in old),
        removed=tuple(m for m in old if m not in new),
        changed=tuple(m for m in both if old[m].load_key != new[m].load_key),
        unchanged=tuple(m for m in both if old[m].load_key == new[m].load_key),
    )


def rebuild_capacity(old_service: CapacityService, old: ServerConfig, new: ServerConfig) -> CapacityService:
    """Capacity for the new config, keeping the boot table unless what it was built from changed (an auto
    budget is measured again at build time: with models loaded it would read smaller than at boot)."""
    service = CapacityService(new)
    before, after = old_service.boot, service.boot
    if before is None or after is None or before.model_id != after.model_id:
        return service
    same_entry = old.models[before.model_id].load_key == new.models[after.model_id].load_key
    same_server = (old.server.memory_budget, old.server.decode_batch) == (new.server.memory_budget,
                                                                           new.server.decode_batch)
    if same_entry and same_server:
        service.boot = before
    return service


def check_new_files(old: ServerConfig, new: ServerConfig) -> None:
    """400 naming the first added or changed model whose file fails the header check. Blocking."""
    changes = diff_models(old.models, new.models)
    for model_id in (*changes.added, *changes.changed):
        entry = new.models[model_id]
        try:
            path = local_entry(entry, new).path
        except GmlxError:
            continue  # a repo id: the loader's 403 on use, as after a start
        problem = None if entry.discovered else file_problem(path)
        if problem is not None:
            raise InvalidConfig(f"reload refused, the running config is kept: model '{model_id}' cannot be "
                                f"loaded: {problem}", param=f"models.{model_id}.path", code="model_file_invalid")


async def reload(host: ReloadHost, check: Callable[[ServerConfig], Awaitable[None]] | None = None) -> dict[str, Any]:
    """{"status": "unsupported"} outside config mode; else the re-registered models (400 on a broken file, or
    when `check`, which sees the new config before anything changes, raises a ConfigError)."""
    if host.config.source is None:
        return {"status": "unsupported"}
    try:
        config = await asyncio.to_thread(lambda: check_drafts(reload_config(host.config)))
        if host.files.check_headers:
            await asyncio.to_thread(check_new_files, host.config, config)
        if check is not None:
            await check(config)
    except ConfigError as e:
        raise InvalidConfig(f"reload failed, the running config is kept: {e}", param=e.key or None) from e
    changes = await host.reconfigure(config)
    loaded = [m for m in changes.unchanged if m in host.resident]
    return {"status": "reloaded", "source": config.source, **asdict(changes), "kept_loaded": loaded}
