"""The mcp_servers: and assistants: sections -> McpServer and Assistant entries, every key checked by name.

What can be checked without starting anything is checked here (the model an assistant names, the servers
its allowlists name, empty or repeated tool names); whether each server really lists the allowlisted
tools is checked when the server starts them (gmlx_server/assistants/), at start and on reload.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gmlx_server.config.assistant_entries import (
    DEFAULT_MAX_RESULT_CHARS,
    DEFAULT_MAX_STEPS,
    DEFAULT_TOOL_TIMEOUT_S,
    Assistant,
    McpServer,
)
from gmlx_server.config.checker import Checker
from gmlx_server.config.settings import BUILTIN_INTENTS, ServerConfig

SERVER_KEYS = frozenset({"command", "args", "env", "cwd", "url", "headers"})
ASSISTANT_KEYS = frozenset({"model", "system", "tools", "max_steps", "tool_timeout_s", "max_result_chars",
                            "tool_choice"})
KEYS = SERVER_KEYS | ASSISTANT_KEYS | {"mcp_servers", "assistants"}  # the reference test lists these


def parse_mcp_servers(c: Checker, raw: Any, base: Path) -> dict[str, McpServer]:
    return {str(name): _server(c, str(name), value, base) for name, value in c.section(raw, "mcp_servers").items()}


def _server(c: Checker, name: str, raw: Any, base: Path) -> McpServer:
    key = f"mcp_servers.{name}"
    data = c.section(raw, key, SERVER_KEYS)
    if (data.get("command") is None) == (data.get("url") is None):
        raise c.fail(key, "give either command (a stdio server) or url (a streamable HTTP server)")
    if data.get("url") is not None:
        stdio_only = [k for k in ("args", "env", "cwd") if data.get(k) is not None]
        if stdio_only:
            raise c.fail(f"{key}.{stdio_only[0]}", "only a stdio server (command) takes args, env and cwd")
        url = c.value(data, key, "url", "str")
        if not url.startswith(("http://", "https://")):
            raise c.fail(f"{key}.url", f"expected an http:// or https:// URL, got {url!r}")
        return McpServer(name, url=url, headers=_pairs(c, data.get("headers"), f"{key}.headers"))
    if data.get("headers") is not None:
        raise c.fail(f"{key}.headers", "only a streamable HTTP server (url) takes headers")
    command, args = _command(c, data, key)
    cwd = c.value(data, key, "cwd", "str")
    return McpServer(name, command=command, args=args, env=_pairs(c, data.get("env"), f"{key}.env"),
                     cwd=c.path(cwd, f"{key}.cwd", base) if cwd is not None else None)


def _command(c: Checker, data: Mapping[str, Any], key: str) -> tuple[str, tuple[str, ...]]:
    """`command: prog` with `args: [...]`, or `command: [prog, arg, ...]`: run as is, never through a shell."""
    raw, args = data["command"], _strings(c, data.get("args") or [], f"{key}.args")
    if isinstance(raw, list):
        parts = _strings(c, raw, f"{key}.command")
        if not parts or not parts[0]:
            raise c.fail(f"{key}.command", "an empty command")
        if args:
            raise c.fail(f"{key}.args", "give args either in a command list or under args, not both")
        return parts[0], parts[1:]
    if not isinstance(raw, str) or not raw:
        raise c.fail(f"{key}.command", f"expected a program or a list [program, arg, ...], got {raw!r}")
    return raw, args


def _strings(c: Checker, raw: Any, key: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise c.fail(key, "expected a list of strings")
    return tuple(raw)


def _pairs(c: Checker, raw: Any, key: str) -> tuple[tuple[str, str], ...]:
    """env / headers: string names to string values (the values are never printed: they may be secrets)."""
    data = c.section(raw, key)
    bad = next((k for k, v in data.items() if not isinstance(v, str)), None)
    if bad is not None:
        raise c.fail(f"{key}.{bad}", f"expected a string value, got {type(data[bad]).__name__}")
    return tuple((str(k), v) for k, v in data.items())


def parse_assistants(c: Checker, raw: Any) -> dict[str, Assistant]:
    return {str(aid): _assistant(c, str(aid), value) for aid, value in c.section(raw, "assistants").items()}


def _assistant(c: Checker, aid: str, raw: Any) -> Assistant:
    key = f"assistants.{aid}"
    data = c.section(raw, key, ASSISTANT_KEYS)
    model = c.value(data, key, "model", "str")
    if not model:
        raise c.fail(f"{key}.model", "missing (the model id, alias or id@profile the assistant runs on)")
    max_steps = c.value(data, key, "max_steps", "int", DEFAULT_MAX_STEPS)
    timeout = float(c.value(data, key, "tool_timeout_s", "number", DEFAULT_TOOL_TIMEOUT_S))
    cap = c.value(data, key, "max_result_chars", "int", DEFAULT_MAX_RESULT_CHARS)
    for name, value in (("max_steps", max_steps), ("tool_timeout_s", timeout), ("max_result_chars", cap)):
        if value <= 0:
            raise c.fail(f"{key}.{name}", f"must be more than 0, got {value}")
    choice = c.value(data, key, "tool_choice", "str", "auto")
    if choice not in ("auto", "required"):
        raise c.fail(f"{key}.tool_choice", f"expected auto or required, got {choice!r}")
    return Assistant(aid, model, _allowlists(c, data.get("tools"), f"{key}.tools"),
                     c.value(data, key, "system", "str"), max_steps, timeout, cap, choice)


def _allowlists(c: Checker, raw: Any, key: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    data = c.section(raw, key)
    if not data:
        raise c.fail(key, "missing: name the MCP servers the assistant may use, each with its allowed tool names")
    out, seen = [], set[str]()
    for server, names in data.items():
        tools = _strings(c, names if names is not None else [], f"{key}.{server}")
        if not tools:
            raise c.fail(f"{key}.{server}", "an empty allowlist: name the tools this assistant may call")
        for tool in tools:
            if not tool or tool in seen:
                raise c.fail(f"{key}.{server}", f"tool {tool!r} is empty or listed twice (names must be unique "
                                                "across an assistant's servers: the model calls tools by name)")
            seen.add(tool)
        out.append((str(server), tools))
    return tuple(out)


def check_assistant_refs(c: Checker, cfg: ServerConfig) -> None:
    """Each assistant runs on a configured model, uses configured servers, and has a name of its own."""
    taken = {n: "models" for n in cfg.models} | {n: "aliases" for n in cfg.aliases}
    taken |= {n: f"services.{s.kind}" for s in cfg.services.values() for n in (s.id, *s.aliases)}
    profiles = set(cfg.profiles) | set(BUILTIN_INTENTS)
    for a in cfg.assistants.values():
        key = f"assistants.{a.id}"
        if a.id in taken:
            raise c.fail(key, f"the name {a.id!r} is already used under {taken[a.id]}")
        mid, _, prof = a.model.rpartition("@") if a.model not in taken else (a.model, "", "")
        if taken.get(mid) not in ("models", "aliases") or (prof and prof not in profiles):
            raise c.fail(f"{key}.model", f"{a.model!r} is not a model id, alias or id@profile under models:")
        for server in a.servers:
            if server not in cfg.mcp_servers:
                known = ", ".join(sorted(cfg.mcp_servers)) or "none"
                raise c.fail(f"{key}.tools.{server}", f"unknown MCP server {server!r} (mcp_servers: {known})")
