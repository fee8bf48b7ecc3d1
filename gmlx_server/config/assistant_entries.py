"""The assistants' settings: MCP servers (mcp_servers:) and the assistant ids that may call their tools
(assistants:). Stdlib only, like settings.py, which holds them in ServerConfig.

README's "Assistants" section says what each key does for an operator; config/assistants.py checks them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

McpTransport = Literal["stdio", "http"]
FirstTurn = Literal["auto", "required"]
DEFAULT_MAX_STEPS = 8
DEFAULT_TOOL_TIMEOUT_S = 30.0
DEFAULT_MAX_RESULT_CHARS = 16_000


@dataclass(frozen=True)
class McpServer:
    """mcp_servers.NAME: a stdio server (command, args, env, cwd) or a streamable HTTP one (url, headers).
    env and headers are (name, value) pairs: hashable, so a reload can tell an unchanged server."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # values may be secrets: never shown
    cwd: str | None = None
    url: str | None = None
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @property
    def transport(self) -> McpTransport:
        return "stdio" if self.command is not None else "http"


@dataclass(frozen=True)
class Assistant:
    """assistants.ID: a model (id, alias or id@profile) whose tool calls the server runs through MCP."""

    id: str
    model: str
    tools: tuple[tuple[str, tuple[str, ...]], ...]  # (MCP server name, the tool names it may call), in order
    system: str | None = None
    max_steps: int = DEFAULT_MAX_STEPS  # tool rounds one request may run before the answer says it stopped
    tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S  # one tool call, from sending it to its result
    max_result_chars: int = DEFAULT_MAX_RESULT_CHARS  # a tool result the model sees is cut to this
    tool_choice: FirstTurn = "auto"  # required: each request's first turn must call a tool (later turns: auto)

    @property
    def servers(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.tools)

    def allowed(self) -> tuple[str, ...]:
        """Every tool name this assistant may call, in the order the config lists them."""
        return tuple(tool for _, names in self.tools for tool in names)
