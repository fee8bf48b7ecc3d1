"""Starting an assistant's MCP servers: a tool the server does not list, a server that cannot start or cannot
be reached stop the start with the key named, and leave no process behind; results are cut and typed."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import types

from gmlx_server.assistants import Assistants
from gmlx_server.assistants.toolbox import cut, failure_content, result_text
from gmlx_server.config import ConfigError
from gmlx_server.config.parse import parse
from tests.assistants.tools_server import started_pids, stdio_entry
from tests.conftest import smollm2_path
from tests.e2e.server import free_port


def start(tmp_path: Path, servers: dict[str, Any], tools: dict[str, list[str]]) -> ConfigError:
    text = yaml.safe_dump({"models": {"m1": {"path": smollm2_path()}}, "mcp_servers": servers,
                           "assistants": {"helper": {"model": "m1", "tools": tools}}})
    cfg = parse(str(tmp_path / "gmlx.yaml"), text)
    with pytest.raises(ConfigError) as err:
        asyncio.run(Assistants(cfg).start())
    return err.value


def test_a_tool_the_server_does_not_list_stops_the_start(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    err = start(tmp_path, {"caps": stdio_entry(log)}, {"caps": ["lookup_capital", "nope"]})
    assert err.key == "assistants.helper.tools.caps"
    assert err.what == ("MCP server 'caps' does not list 'nope' (it lists: add, fail_always, lookup_capital, "
                        "sleep_forever)")
    [pid] = started_pids(log)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the server it started to check is stopped again


def test_a_server_that_cannot_start_or_be_reached_is_named(tmp_path: Path) -> None:
    err = start(tmp_path, {"gone": {"command": str(tmp_path / "no-such-program")}}, {"gone": ["x"]})
    assert err.key == "mcp_servers.gone" and "assistant 'helper' could not start or reach it" in err.what
    err = start(tmp_path, {"web": {"url": f"http://127.0.0.1:{free_port()}/mcp"}}, {"web": ["x"]})
    assert err.key == "mcp_servers.web" and "could not start or reach it" in err.what


def test_results_are_cut_and_failures_typed() -> None:
    assert cut("abcdef", 10) == "abcdef"
    assert cut("abcdef", 4) == "abcd\n[gmlx: result cut to 4 of 6 characters]"
    text, image = types.TextContent(text="hello"), types.ImageContent(data="", mime_type="image/png")
    link = types.ResourceLink(name="r", uri="file:///r")
    doc = types.EmbeddedResource(resource=types.TextResourceContents(uri="file:///d", text="body"))
    blob = types.EmbeddedResource(resource=types.BlobResourceContents(uri="file:///b", blob=""))
    assert result_text(types.CallToolResult(content=[text, image, link, doc, blob])) == (
        "hello\n[image content (image/png) not shown]\n[resource: file:///r]\nbody\n"
        "[resource content (no type) not shown]")
    assert result_text(types.CallToolResult(content=[], structured_content={"a": 1})) == '{"a": 1}'
    assert failure_content("tool_timeout", "late") == '{"error": {"type": "tool_timeout", "message": "late"}}'
