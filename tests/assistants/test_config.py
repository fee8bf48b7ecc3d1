"""mcp_servers: and assistants: in the YAML: every key honoured or refused by name, secrets never printed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gmlx_server.config import ConfigError
from gmlx_server.config.parse import parse
from tests.conftest import smollm2_path


def config(tmp_path: Path, servers: Any = None, assistants: Any = None, **top: Any) -> str:
    body = {"models": {"m1": {"path": smollm2_path()}}, "aliases": {"fast": "m1"},
            "mcp_servers": servers if servers is not None else {"caps": {"command": "python", "args": ["-m", "x"]}},
            "assistants": assistants if assistants is not None else {"helper": {"model": "m1",
                                                                                "tools": {"caps": ["add"]}}},
            **top}
    return yaml.safe_dump(body)


def load(tmp_path: Path, text: str) -> Any:
    return parse(str(tmp_path / "gmlx.yaml"), text)


def test_a_full_entry_loads(tmp_path: Path) -> None:
    servers = {"caps": {"command": ["python", "-m", "tools"], "env": {"ROOT": "/srv"}, "cwd": str(tmp_path)},
               "web": {"url": "https://tools.example/mcp", "headers": {"Authorization": "Bearer s3cret"}}}
    assistants = {"helper": {"model": "m1@precise", "system": "Be brief.", "max_steps": 3, "tool_timeout_s": 2.5,
                             "max_result_chars": 100, "tool_choice": "required",
                             "tools": {"caps": ["add", "lookup_capital"], "web": ["fetch"]}},
                  "other": {"model": "fast", "tools": {"web": ["fetch"]}}}
    cfg = load(tmp_path, config(tmp_path, servers, assistants))
    caps, web = cfg.mcp_servers["caps"], cfg.mcp_servers["web"]
    assert (caps.command, caps.args, caps.env, caps.cwd) == ("python", ("-m", "tools"), (("ROOT", "/srv"),),
                                                              str(tmp_path))
    assert caps.transport == "stdio" and web.transport == "http"
    assert web.headers == (("Authorization", "Bearer s3cret"),)
    assert "s3cret" not in repr(web) and "/srv" not in repr(caps)  # values that may be secrets never show
    helper = cfg.assistants["helper"]
    assert helper.tools == (("caps", ("add", "lookup_capital")), ("web", ("fetch",)))
    assert (helper.model, helper.system, helper.max_steps, helper.tool_timeout_s, helper.max_result_chars) == (
        "m1@precise", "Be brief.", 3, 2.5, 100)
    assert helper.allowed() == ("add", "lookup_capital", "fetch") and helper.tool_choice == "required"
    assert cfg.assistants["other"].model == "fast" and cfg.assistants["other"].tool_choice == "auto"


@pytest.mark.parametrize(("servers", "assistants", "key", "words"), [
    (None, {"h": {"model": "nope", "tools": {"caps": ["add"]}}}, "assistants.h.model", "not a model id"),
    (None, {"h": {"model": "m1@nope", "tools": {"caps": ["add"]}}}, "assistants.h.model", "not a model id"),
    (None, {"h": {"tools": {"caps": ["add"]}}}, "assistants.h.model", "missing"),
    (None, {"h": {"model": "m1", "tools": {"web": ["add"]}}}, "assistants.h.tools.web", "unknown MCP server 'web'"),
    (None, {"h": {"model": "m1", "tools": {"caps": []}}}, "assistants.h.tools.caps", "an empty allowlist"),
    (None, {"h": {"model": "m1"}}, "assistants.h.tools", "missing"),
    (None, {"h": {"model": "m1", "tools": {"caps": ["add", "add"]}}}, "assistants.h.tools.caps", "listed twice"),
    (None, {"h": {"model": "m1", "tools": {"caps": ["add"]}, "max_steps": 0}}, "assistants.h.max_steps", "more than 0"),
    (None, {"h": {"model": "m1", "tools": {"caps": ["add"]}, "tool_timeout_s": 0}}, "assistants.h.tool_timeout_s",
     "more than 0"),
    (None, {"h": {"model": "m1", "tools": {"caps": ["add"]}, "steps": 3}}, "assistants.h.steps", "unknown key"),
    (None, {"h": {"model": "m1", "tools": {"caps": ["add"]}, "tool_choice": "none"}}, "assistants.h.tool_choice",
     "expected auto or required"),
    (None, {"m1": {"model": "m1", "tools": {"caps": ["add"]}}}, "assistants.m1", "already used under models"),
    (None, {"fast": {"model": "m1", "tools": {"caps": ["add"]}}}, "assistants.fast", "already used under aliases"),
    ({"x": {}}, None, "mcp_servers.x", "either command"),
    ({"x": {"command": "a", "url": "http://b"}}, None, "mcp_servers.x", "either command"),
    ({"x": {"url": "ftp://b"}}, None, "mcp_servers.x.url", "http:// or https://"),
    ({"x": {"url": "http://b", "args": ["a"]}}, None, "mcp_servers.x.args", "only a stdio server"),
    ({"x": {"command": "a", "headers": {"A": "b"}}}, None, "mcp_servers.x.headers", "only a streamable HTTP"),
    ({"x": {"command": ["a"], "args": ["b"]}}, None, "mcp_servers.x.args", "not both"),
    ({"x": {"command": []}}, None, "mcp_servers.x.command", "an empty command"),
    ({"x": {"command": "a", "env": {"TOKEN": 7}}}, None, "mcp_servers.x.env.TOKEN", "expected a string"),
    ({"x": {"command": "a", "cwd": "/no/such/dir"}}, None, "mcp_servers.x.cwd", "file not found"),
    ({"x": {"command": "a", "shell": True}}, None, "mcp_servers.x.shell", "unknown key"),
])
def test_bad_entries_are_refused_with_their_key(tmp_path: Path, servers: Any, assistants: Any, key: str,
                                                words: str) -> None:
    if servers is not None and assistants is None:
        assistants = {"h": {"model": "m1", "tools": {"x": ["add"]}}}
    with pytest.raises(ConfigError) as err:
        load(tmp_path, config(tmp_path, servers, assistants))
    assert err.value.key == key and words in err.value.what


def test_a_header_value_is_never_printed(tmp_path: Path) -> None:
    text = config(tmp_path, {"web": {"url": "http://b", "headers": {"Authorization": ["Bearer s3cret"]}}},
                  {"h": {"model": "m1", "tools": {"web": ["x"]}}})
    with pytest.raises(ConfigError) as err:
        load(tmp_path, text)
    assert err.value.key == "mcp_servers.web.headers.Authorization" and "s3cret" not in str(err.value)
