"""The service host: the configured services by kind, their /v1/models rows and /v1/metrics section."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gmlx_server.auxiliary.backends import default_loader
from gmlx_server.auxiliary.fetch import ModelSource
from gmlx_server.auxiliary.service_errors import ServiceNotConfigured
from gmlx_server.auxiliary.service_thread import Loader, Service
from gmlx_server.config import ServerConfig, ServiceEntry, hf_hub_cache_dir
from gmlx_server.errors import ModelNotFound
from gmlx_server.serving.load_gate import HeldWeights
from gmlx_server.serving.model_host import ModelHost

log = logging.getLogger("gmlx.services")
# Until a service loads; then its backend object says (stt and tts: by what the directory holds).
BACKENDS = {"embeddings": "mlx-embeddings", "rerank": "mlx-embeddings", "stt": "faster-whisper or mlx-audio",
            "tts": "piper or mlx-audio"}


def backend_name(svc: Service) -> str:
    return svc.backend_name or BACKENDS[svc.entry.kind]


def uses_chat_model(entry: ServiceEntry) -> bool:
    return entry.kind == "rerank" and str(entry.options.get("method")) == "llm"


class ServiceHost:
    def __init__(self, config: ServerConfig, chat: ModelHost | None = None, loader: Loader = default_loader) -> None:
        self.config, self.chat, self.loader = config, chat, loader
        self.held = chat.held if chat is not None else HeldWeights()  # the chat load gate counts these
        self.services: dict[str, Service] = {k: self._build(e) for k, e in config.services.items()}
        self._tasks: set[asyncio.Task[Any]] = set()

    def _build(self, entry: ServiceEntry) -> Service:
        source = None
        if entry.model is not None and not uses_chat_model(entry):
            source = ModelSource(entry.kind, entry.model, hf_hub_cache_dir(self.config.env),
                                 offline=self.config.server.hf_cache)
        return Service(entry, source, self.loader, self.held)

    def start(self) -> None:
        """At server start: hf: models begin downloading; load: start services begin loading."""
        for svc in self.services.values():
            self._start(svc)

    def _start(self, svc: Service) -> None:
        if svc.source is not None:
            svc.source.start()
        if svc.entry.load != "start":
            return
        if svc.source is not None:
            svc.start_load()
        elif uses_chat_model(svc.entry) and self.chat is not None and svc.entry.model is not None:
            task = asyncio.get_running_loop().create_task(self._load_chat(svc.entry.model))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _load_chat(self, model_id: str) -> None:
        assert self.chat is not None
        try:
            await self.chat.engine(model_id)
        except Exception as exc:  # the first rerank request will meet the same error, typed
            log.error("services.rerank: loading chat model %s at start failed: %s", model_id, exc)

    def service(self, kind: str, route: str, model: str | None = None) -> Service:
        """The route's service; 404 service_not_configured naming the key, or model_not_found for another id."""
        svc = self.services.get(kind)
        if svc is None:
            raise ServiceNotConfigured(route, kind)
        names = [svc.entry.id, *svc.entry.aliases]
        if model and model not in names:
            raise ModelNotFound(model, names)
        return svc

    def embedder_service(self, rerank: Service) -> Service:
        """Where cosine rerank embeds: its own model, else the embeddings service's."""
        return rerank if rerank.source is not None else self.services["embeddings"]

    # --- /v1/models and /v1/metrics -----------------------------------------------------------------

    def rows(self) -> list[dict[str, Any]]:
        rows = []
        for svc in self.services.values():
            e = svc.entry
            row = {"id": e.id, "object": "model", "created": 0, "owned_by": "gmlx", "kind": e.kind,
                   "backend": "chat-model" if uses_chat_model(e) else backend_name(svc), "model": e.model,
                   "resident": svc.backend is not None, "state": svc.state, "load_error": svc.error,
                   "load": e.load, "max_concurrent": e.max_concurrent}
            if e.kind == "rerank":
                row["method"] = e.options["method"]
            rows.append(row)
            rows += [{**row, "id": alias, "alias_of": e.id} for alias in e.aliases]
        return rows

    def section(self) -> dict[str, Any]:
        return {kind: svc.section() for kind, svc in self.services.items()}

    # --- /v1/reload and shutdown ----------------------------------------------------------------------

    def reconfigure(self, config: ServerConfig) -> None:
        """Keep services whose entry is unchanged (and not failed); close the rest; build and start new ones."""
        old, self.config = self.services, config
        self.services = {}
        for kind, entry in config.services.items():
            svc = old.pop(kind, None)
            if svc is None or svc.entry != entry or svc.state == "failed":
                if svc is not None:
                    svc.close()
                svc = self._build(entry)
                self._start(svc)
            self.services[kind] = svc
        for svc in old.values():
            svc.close()

    def close(self) -> None:
        for svc in self.services.values():
            svc.close()
