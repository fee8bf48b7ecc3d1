"""One assistant's tools: the allowlisted ones its MCP servers list, described to the model, and one call run
through the server that lists it. A call outside the allowlist never reaches any server: the model gets a
`tool_not_allowed` result naming the tools it may call. Every failure is a typed result the model reads.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gmlx_server.assistants.link import McpLink, ToolFailure
from gmlx_server.assistants.tool_metrics import ToolMetrics
from gmlx_server.config import ConfigError
from gmlx_server.config.assistant_entries import Assistant
from gmlx_server.protocol.shared import tool_function

if TYPE_CHECKING:
    from mcp.types import CallToolResult, ContentBlock


@dataclass(frozen=True)
class ToolOutcome:
    """One call and what came of it: `content` is what the model reads next."""

    step: int
    call_id: str
    name: str
    arguments: Mapping[str, Any]
    server: str | None  # None: not on the allowlist, sent nowhere
    content: str
    error: Mapping[str, str] | None  # {"type", "message"}; None when the tool answered
    duration_s: float

    def trace(self) -> dict[str, Any]:
        """The call as clients see it in `tool_trace`."""
        return {"step": self.step, "id": self.call_id, "tool": self.name, "server": self.server,
                "arguments": dict(self.arguments), "ok": self.error is None, "result": self.content,
                "error": dict(self.error) if self.error is not None else None, "duration_s": round(self.duration_s, 3)}


def failure_content(kind: str, message: str, **extra: Any) -> str:
    """A typed failure as the model reads it: one JSON object."""
    return json.dumps({"error": {"type": kind, "message": message, **extra}}, ensure_ascii=False)


def cut(text: str, limit: int) -> str:
    """At most `limit` characters, marked when cut (the model knows it saw part of the result)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[gmlx: result cut to {limit} of {len(text)} characters]"


def result_text(result: CallToolResult) -> str:
    """A CallToolResult's content as text: text blocks as they are, other blocks named, else the structure."""
    parts = [_block_text(block) for block in result.content]
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


def _block_text(block: ContentBlock) -> str:
    from mcp import types  # the SDK loads when an assistant is configured

    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ResourceLink):
        return f"[resource: {block.uri}]"
    if isinstance(block, types.EmbeddedResource):
        if isinstance(block.resource, types.TextResourceContents):
            return block.resource.text
        mime = block.resource.mime_type
    else:  # ImageContent, AudioContent
        mime = block.mime_type
    return f"[{block.type} content ({mime or 'no type'}) not shown]"


class Toolbox:
    """An assistant's entry and its started links (one per MCP server it uses)."""

    def __init__(self, entry: Assistant, links: Mapping[str, McpLink], metrics: ToolMetrics) -> None:
        self.entry, self.links, self.metrics = entry, dict(links), metrics
        self.server_of = {tool: server for server, names in entry.tools for tool in names}

    def check(self, source: str) -> None:
        """Every allowlisted tool is listed by its server; a ConfigError naming the allowlist if not."""
        for server, names in self.entry.tools:
            listed = self.links[server].tools
            missing = [n for n in names if n not in listed]
            if missing:
                raise ConfigError(source, f"assistants.{self.entry.id}.tools.{server}",
                                  f"MCP server '{server}' does not list {', '.join(map(repr, missing))} "
                                  f"(it lists: {', '.join(sorted(listed)) or 'no tools'})")

    def model_tools(self) -> tuple[dict[str, Any], ...]:
        """The allowlisted tools as the chat template receives them (description and schema from the server)."""
        out = []
        for tool, server in self.server_of.items():
            listed = self.links[server].tools.get(tool)
            if listed is not None:
                out.append(tool_function(tool, listed.description, dict(listed.schema)))
        return tuple(out)

    async def run(self, step: int, call_id: str, name: str, arguments: Mapping[str, Any]) -> ToolOutcome:
        """One call, bounded in time and result size; never raises for the tool's sake."""
        t0 = time.monotonic()
        server = self.server_of.get(name)
        if server is None:
            allowed = list(self.server_of)
            message = (f"tool '{name}' is not allowed for assistant '{self.entry.id}'; the allowed tools are: "
                       f"{', '.join(allowed)}")
            return self._outcome(step, call_id, name, arguments, None, t0, ("tool_not_allowed", message),
                                 allowed_tools=allowed)
        try:
            result = await self.links[server].call(name, arguments, self.entry.tool_timeout_s)
        except ToolFailure as f:
            return self._outcome(step, call_id, name, arguments, server, t0, (f.kind, f.message))
        text = cut(result_text(result), self.entry.max_result_chars)
        if result.is_error:
            return self._outcome(step, call_id, name, arguments, server, t0, ("tool_error", text or "failed"))
        return self._outcome(step, call_id, name, arguments, server, t0, None, text=text)

    def _outcome(self, step: int, call_id: str, name: str, arguments: Mapping[str, Any], server: str | None,
                 t0: float, failure: tuple[str, str] | None, text: str = "", **extra: Any) -> ToolOutcome:
        duration = time.monotonic() - t0
        self.metrics.record(self.entry.id, name if server is not None else None,
                            failure[0] if failure else "ok", duration)
        if failure is None:
            return ToolOutcome(step, call_id, name, arguments, server, text, None, duration)
        kind, message = failure
        return ToolOutcome(step, call_id, name, arguments, server, failure_content(kind, message, **extra),
                           {"type": kind, "message": message}, duration)
