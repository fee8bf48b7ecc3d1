"""The assistants' test MCP server, written with the official MCP SDK's server side (MCPServer).

    python tests/assistants/mcp_server.py stdio CALL_LOG
    python tests/assistants/mcp_server.py http CALL_LOG PORT

Tools: add, lookup_capital (a made-up country's capital, which no model can know), fail_always and
sleep_forever. Every call that reaches a tool appends one JSON line {"pid", "tool", "arguments"} to CALL_LOG,
and the server appends {"pid", "started": true} when it starts: the log is the server's own record of what
arrived, so a test can prove a call never did, and see a restart as a new pid.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer

CAPITALS = {"zubrowka": "Lutz", "freedonia": "Fredville", "france": "Paris"}
server = MCPServer("gmlx-test-tools")


def record(entry: dict[str, Any]) -> None:
    with Path(sys.argv[2]).open("a", encoding="utf-8") as f:
        f.write(json.dumps({"pid": os.getpid(), **entry}) + "\n")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    record({"tool": "add", "arguments": {"a": a, "b": b}})
    return str(a + b)


@server.tool()
def lookup_capital(country: str) -> str:
    """The capital city of a country (including fictional ones)."""
    record({"tool": "lookup_capital", "arguments": {"country": country}})
    capital = CAPITALS.get(country.strip().lower())
    return f"The capital of {country} is {capital}." if capital else f"No capital is known for {country}."


@server.tool()
def fail_always(reason: str = "") -> str:
    """Always fails."""
    record({"tool": "fail_always", "arguments": {"reason": reason}})
    raise RuntimeError("fail_always failed, as it always does")


@server.tool()
async def sleep_forever() -> str:
    """Never returns."""
    record({"tool": "sleep_forever", "arguments": {}})
    await asyncio.sleep(3600)
    return "woke up"


def main() -> None:
    record({"started": True})
    print(f"gmlx-test-tools {os.getpid()} starting", file=sys.stderr, flush=True)  # the log shows stderr lines
    if sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[3]))
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
