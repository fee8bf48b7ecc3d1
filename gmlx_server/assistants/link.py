"""One MCP server for one assistant, through the official MCP Python SDK's client: connect (a stdio server
is spawned), list its tools, call them under a deadline, restart it with backoff when it dies, stop it.

The SDK's sessions live in anyio task groups, which must be entered and left by one task: each link owns
a task that holds the connection open; calls from request tasks go through the connected client. A stdio
server's stderr goes to the `gmlx.mcp` log, each line tagged with the assistant and server, and its end
(the process exited) is how a dead stdio server is noticed; any server is also marked dead when a call
finds its connection closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import IO, Any, Literal, TextIO

import anyio

from gmlx_server.config.assistant_entries import McpServer

log = logging.getLogger("gmlx.mcp")
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
HEALTHY_S = 30.0  # a connection that lived this long was healthy: the next restart waits BACKOFF_START_S again
CONNECT_S = 30.0  # to start (or reach) a server and list its tools; past it the attempt failed
LinkState = Literal["stopped", "starting", "ready", "restarting", "closed"]


@dataclass(frozen=True)
class ListedTool:
    """A tool as the server lists it: what the model is told about it."""

    name: str
    description: str | None
    schema: Mapping[str, Any]


class LinkFailed(Exception):
    """The server could not be started or reached, or could not list its tools."""


class ToolFailure(Exception):
    """A call that produced no result: `kind` is what the model is told (tool_timeout, tool_unavailable,
    tool_error)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


class StderrPump:
    """A pipe for one stdio server's stderr: a thread logs its lines; `ended` is set when every writer is gone
    (the process and its children exited)."""

    def __init__(self, tag: str) -> None:
        read_fd, write_fd = os.pipe()
        self.writer: TextIO = os.fdopen(write_fd, "w")
        self.ended = asyncio.Event()
        reader = os.fdopen(read_fd, "r", encoding="utf-8", errors="replace")
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._pump, args=(reader, tag, loop), daemon=True, name=f"mcp-stderr {tag}").start()

    def _pump(self, reader: IO[str], tag: str, loop: asyncio.AbstractEventLoop) -> None:
        with reader:
            for line in reader:
                if line.strip():
                    log.info("mcp %s: %s", tag, line.rstrip())
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits for the end
            loop.call_soon_threadsafe(self.ended.set)

    def spawned(self) -> None:
        """The child holds its own copy of the write end: ours must close for the end to show."""
        self.writer.close()


class McpLink:
    def __init__(self, assistant_id: str, spec: McpServer, clock: Any = time.monotonic) -> None:
        self.assistant_id, self.spec, self._clock = assistant_id, spec, clock
        self.tag = f"{assistant_id}/{spec.name}"
        self.tools: dict[str, ListedTool] = {}
        self.state: LinkState = "stopped"
        self.restarts = 0
        self.last_error: str | None = None
        self._client: Any = None  # mcp.Client while connected
        self._ready = asyncio.Event()
        self._dead = asyncio.Event()  # a call found the connection closed
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._first: asyncio.Future[None] | None = None

    # --- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect and list the tools; raises LinkFailed when the first attempt fails (no retry at start)."""
        if self._task is not None:
            return
        self.state = "starting"
        self._first = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(), name=f"mcp {self.tag}")
        await asyncio.shield(self._first)

    async def close(self) -> None:
        """Stop the connection (a stdio server: stdin closed, then terminated); idempotent."""
        self._closing.set()
        self.state = "closed"
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._task = None

    async def _run(self) -> None:
        backoff = BACKOFF_START_S
        while not self._closing.is_set():
            began = self._clock()
            try:
                await self._serve_once()
            except Exception as e:  # one connection's end, however it ended: restart below
                self.last_error = _describe(e)
                if not self._resolve_first(LinkFailed(self.last_error)):
                    return
                log.warning("mcp %s: connection lost (%s)", self.tag, self.last_error)
            if self._closing.is_set():
                break
            if self._clock() - began >= HEALTHY_S:
                backoff = BACKOFF_START_S
            self.state = "restarting"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)
            self.restarts += 1
            log.info("mcp %s: restarting (restart %d)", self.tag, self.restarts)

    def _resolve_first(self, error: Exception | None) -> bool:
        """Settle start()'s future once; False when this was the first attempt and it failed."""
        first, self._first = self._first, None
        if first is None or first.done():
            return True
        if error is None:
            first.set_result(None)
            return True
        self.state = "stopped"
        first.set_exception(error)
        return False

    async def _serve_once(self) -> None:
        """One connection: connect, list, then hold it until it dies or the link closes."""
        async with contextlib.AsyncExitStack() as stack:
            try:
                async with asyncio.timeout(CONNECT_S):
                    client, pump = await stack.enter_async_context(self._connect())
                    self.tools = await _listing(client)
            except TimeoutError:
                raise LinkFailed(f"no answer within {CONNECT_S:g} s") from None
            self._client, self.last_error = client, None
            self._dead.clear()
            self.state = "ready"
            self._ready.set()
            self._resolve_first(None)
            try:
                await self._hold(pump)
            finally:
                self._ready.clear()
                self._client = None
        if not self._closing.is_set() and self.state == "ready":
            raise LinkFailed("the server's process exited" if self.spec.command else "the connection closed")

    async def _hold(self, pump: StderrPump | None) -> None:
        waits = [self._closing.wait(), self._dead.wait(), *([pump.ended.wait()] if pump is not None else [])]
        tasks = [asyncio.ensure_future(w) for w in waits]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()

    @contextlib.asynccontextmanager
    async def _connect(self) -> AsyncIterator[tuple[Any, StderrPump | None]]:
        from mcp import Client, Implementation  # the SDK loads when an assistant is configured

        async with contextlib.AsyncExitStack() as stack:
            pump = StderrPump(self.tag) if self.spec.command is not None else None
            transport = self._transport(stack, pump)
            client = await stack.enter_async_context(
                Client(await transport, client_info=Implementation(name="gmlx", version="0.1.0")))
            if pump is not None:
                pump.spawned()
            yield client, pump

    async def _transport(self, stack: contextlib.AsyncExitStack, pump: StderrPump | None) -> Any:
        s = self.spec
        if s.command is not None and pump is not None:
            from mcp.client.stdio import StdioServerParameters, stdio_client

            stack.callback(lambda: pump.writer.closed or pump.writer.close())
            params = StdioServerParameters(command=s.command, args=list(s.args), env=dict(s.env), cwd=s.cwd)
            return stdio_client(params, errlog=pump.writer)  # an argument list: no shell ever parses it
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        http = await stack.enter_async_context(create_mcp_http_client(headers=dict(s.headers)))
        return streamable_http_client(str(s.url), http_client=http)

    # --- calls ------------------------------------------------------------------------------------

    async def refresh(self) -> dict[str, ListedTool]:
        """The server's listing asked again (a reload checks allowlists against it)."""
        if self._client is None:
            raise LinkFailed(self.last_error or "not connected")
        self.tools = await _listing(self._client, refresh=True)
        return self.tools

    async def call(self, name: str, arguments: Mapping[str, Any], timeout_s: float) -> Any:
        """The CallToolResult; ToolFailure when none came within `timeout_s` (waiting for a restart included)."""
        from mcp import MCPError

        deadline = asyncio.get_running_loop().time() + timeout_s
        try:
            await asyncio.wait_for(self._ready.wait(), timeout_s)
        except TimeoutError:
            why = f" (last error: {self.last_error})" if self.last_error else ""
            raise ToolFailure("tool_unavailable", f"MCP server '{self.spec.name}' is not connected; it is being "
                                                  f"restarted{why}") from None
        client = self._client
        try:
            async with asyncio.timeout_at(deadline):
                return await client.call_tool(name, dict(arguments))
        except TimeoutError:
            raise ToolFailure("tool_timeout", f"{name} did not answer within {timeout_s:g} s") from None
        except MCPError as e:
            if e.code == _CONNECTION_CLOSED:
                self._dead.set()
                raise ToolFailure("tool_unavailable", f"MCP server '{self.spec.name}' closed the connection "
                                                      "during the call; it is being restarted") from None
            raise ToolFailure("tool_error", f"MCP error {e.code}: {e.message}") from None
        except Exception as e:
            if not _connection_lost(e):  # a malformed result, say: this call failed, the server lives
                raise ToolFailure("tool_error", _describe(e)) from None
            self._dead.set()
            raise ToolFailure("tool_unavailable", f"MCP server '{self.spec.name}' failed: {_describe(e)}") from None


_CONNECTION_CLOSED = -32000  # the SDK's code for a connection that ended under a request


async def _listing(client: Any, refresh: bool = False) -> dict[str, ListedTool]:
    tools: dict[str, ListedTool] = {}
    cursor = None
    while True:
        page = await client.list_tools(cursor=cursor, cache_mode="refresh" if refresh else "use")
        for t in page.tools:
            tools[t.name] = ListedTool(t.name, t.description, dict(t.input_schema))
        cursor = page.next_cursor
        if cursor is None:
            return tools


def _connection_lost(e: BaseException) -> bool:
    import httpx2

    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return isinstance(e, anyio.ClosedResourceError | anyio.BrokenResourceError | anyio.EndOfStream | OSError
                      | httpx2.TransportError)


def _describe(e: BaseException) -> str:
    """An exception (or the first leaf of an anyio exception group) as one line."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
