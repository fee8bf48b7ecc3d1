"""The configured assistants and their MCP links: started and checked at start (every allowlisted tool must
be listed by its server), checked again before a reload swaps them in, stopped on shutdown, on /unload of an
assistant id, and for assistants a reload removed. A request to an assistant whose links are not running
(before start, or after /unload) starts them first.

Links are per assistant: two assistants that use one MCP server each run (or connect to) their own.
A reload keeps a link whose server entry is unchanged, so an allowlist edit takes effect at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from gmlx_server.assistants.link import LinkFailed, McpLink
from gmlx_server.assistants.tool_metrics import ToolMetrics
from gmlx_server.assistants.toolbox import Toolbox
from gmlx_server.config import ConfigError, ServerConfig
from gmlx_server.config.assistant_entries import Assistant
from gmlx_server.errors import GmlxError
from gmlx_server.serving.telemetry import Telemetry

log = logging.getLogger("gmlx.assistants")
LinkKey = tuple[str, str]  # (assistant id, MCP server name)


class AssistantUnavailable(GmlxError):
    status, type = 503, "assistant_unavailable"


class Assistants:
    def __init__(self, config: ServerConfig, telemetry: Telemetry | None = None) -> None:
        self.config = config
        self.metrics = ToolMetrics()
        # request id -> its loop's step: the assistants section and, through telemetry, the engine rows show it
        self.active: dict[str, dict[str, Any]] = telemetry.assistant_steps if telemetry is not None else {}
        self._boxes: dict[str, Toolbox] = {}
        self._staged: tuple[ServerConfig, dict[str, Toolbox]] | None = None
        self._lock = asyncio.Lock()

    def entry(self, name: str) -> Assistant | None:
        return self.config.assistants.get(name)

    @property
    def _source(self) -> str:
        return self.config.source or "config"

    # --- start, reload, stop ---------------------------------------------------------------------

    async def start(self) -> None:
        """Every assistant's links, started and checked; a ConfigError naming the key when one fails."""
        async with self._lock:
            self._boxes = await self._build(self.config, self.config.assistants.values(), self._boxes)

    async def toolbox(self, assistant: Assistant) -> Toolbox:
        """The assistant's running toolbox, started now if it is not."""
        box = self._boxes.get(assistant.id)
        if box is not None and box.entry == assistant:
            return box
        async with self._lock:
            box = self._boxes.get(assistant.id)
            if box is None or box.entry != assistant:
                try:
                    built = await self._build(self.config, [assistant], self._boxes)
                except ConfigError as e:
                    raise AssistantUnavailable(f"assistant '{assistant.id}' cannot start its tools: {e.what}",
                                               param="model", code=e.key) from None
                self._boxes.update(built)
            return self._boxes[assistant.id]

    async def stage(self, config: ServerConfig) -> None:
        """Before a reload swaps configs: the new assistants' links started and checked (a ConfigError naming
        the key keeps the running config); links whose server entry is unchanged are kept."""
        async with self._lock:
            staged = await self._build(config, config.assistants.values(), self._boxes)
            self._staged = (config, staged)

    def commit(self, config: ServerConfig) -> None:
        """The reload went through: serve the staged assistants, stop links nothing uses any more."""
        done = self._staged[0] if self._staged is not None else None
        same = done is not None and (done.assistants, done.mcp_servers) == (config.assistants, config.mcp_servers)
        staged = self._staged[1] if self._staged is not None and same else {}
        self._staged = None
        old, self._boxes, self.config = self._boxes, staged, config
        self._stop(_links(old.values()) - _links(staged.values()))

    async def unload(self, assistant_id: str) -> bool:
        """Stop the assistant's links (its next request starts them again)."""
        async with self._lock:
            box = self._boxes.pop(assistant_id, None)
            if box is not None:
                await asyncio.gather(*(link.close() for link in box.links.values()))
            return box is not None

    async def close(self) -> None:
        boxes, self._boxes = self._boxes, {}
        await asyncio.gather(*(link.close() for link in _links(boxes.values())))

    def _stop(self, links: set[McpLink]) -> None:
        for link in links:
            asyncio.get_running_loop().create_task(link.close(), name=f"close mcp {link.tag}")

    async def _build(self, config: ServerConfig, entries: Iterable[Assistant],
                     current: Mapping[str, Toolbox]) -> dict[str, Toolbox]:
        """Toolboxes for `entries`, reusing current links whose server is unchanged; new links are closed again
        when anything fails."""
        reuse = {(box.entry.id, name): link for box in current.values() for name, link in box.links.items()}
        links: dict[LinkKey, McpLink] = {}
        for a in entries:
            for server in a.servers:
                old = reuse.get((a.id, server))
                spec = config.mcp_servers[server]
                links[(a.id, server)] = old if old is not None and old.spec == spec else McpLink(a.id, spec)
        fresh = [link for link in links.values() if link not in reuse.values()]
        try:
            await self._ready(config, links, fresh)
            boxes = {a.id: Toolbox(a, {s: links[(a.id, s)] for s in a.servers}, self.metrics) for a in entries}
            for box in boxes.values():
                box.check(config.source or "config")
        except BaseException:
            await asyncio.gather(*(link.close() for link in fresh))
            raise
        return boxes

    async def _ready(self, config: ServerConfig, links: Mapping[LinkKey, McpLink], fresh: list[McpLink]) -> None:
        """Start the new links and list the kept ones' tools again, all at once; the first failure raised."""
        keys = list(links)
        results = await asyncio.gather(*(links[k].start() if links[k] in fresh else links[k].refresh()
                                         for k in keys), return_exceptions=True)
        for (aid, server), outcome in zip(keys, results, strict=True):
            if isinstance(outcome, BaseException):
                what = str(outcome) if isinstance(outcome, LinkFailed) else f"{type(outcome).__name__}: {outcome}"
                raise ConfigError(config.source or "config", f"mcp_servers.{server}",
                                  f"assistant '{aid}' could not start or reach it: {what}")

    # --- what clients and metrics see ------------------------------------------------------------

    def rows(self, model_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """/v1/models rows: the model row of each assistant's model, under the assistant's id and marker."""
        by_id = {r["id"]: r for r in model_rows}
        out = []
        for a in self.config.assistants.values():
            base = by_id.get(a.model) or by_id.get(a.model.rpartition("@")[0]) or {}
            row = {k: v for k, v in base.items() if k not in ("alias_of", "default", "discovered", "pinned")}
            out.append({**row, "id": a.id, "object": "model", "owned_by": "gmlx", "kind": "assistant",
                        "assistant": True, "model": a.model, "tools": {s: list(names) for s, names in a.tools},
                        "max_steps": a.max_steps, "tool_timeout_s": a.tool_timeout_s,
                        "max_result_chars": a.max_result_chars})
        return out

    def section(self) -> dict[str, Any]:
        """/v1/metrics `assistants`: per assistant its servers' state, its tool calls and its live loops."""
        out = {}
        for a in self.config.assistants.values():
            box = self._boxes.get(a.id)
            servers = {name: _link_json(box.links.get(name) if box else None) for name in a.servers}
            out[a.id] = {"model": a.model, "servers": servers, "tools": self.metrics.json(a.id, a.allowed()),
                         "active": [{"id": rid, **row} for rid, row in self.active.items()
                                    if row["assistant"] == a.id]}
        return out


def _link_json(link: McpLink | None) -> dict[str, Any]:
    if link is None:
        return {"state": "stopped", "restarts": 0, "last_error": None}
    return {"transport": link.spec.transport, "state": link.state, "restarts": link.restarts,
            "last_error": link.last_error}


def _links(boxes: Iterable[Toolbox]) -> set[McpLink]:
    return {link for box in boxes for link in box.links.values()}
