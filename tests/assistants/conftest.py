"""An assistant over the scripted fake engine, on a real uvicorn (its lifespan starts the MCP servers), with
the test MCP server over stdio and over streamable HTTP. The fake model's turns follow a scenario named in
the user's message; each later turn sees the tool results before it (the fake template prints them)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gmlx_server.app import create_app
from gmlx_server.config import load_config
from gmlx_server.engine.types import GenerationRequest
from tests.assistants.tools_server import http_server, stdio_entry
from tests.conftest import smollm2_path
from tests.fakes import HERMES_TEXT, FakeBehavior, FakeFactory
from tests.routes.conftest import Lines, ThreadedServer

KEY = "assistant-key"
Call = tuple[str, dict[str, Any]]
# Scenario -> the call each turn makes (by turn), then the answer.
SCENARIOS: dict[str, Callable[[int], Call | None]] = {
    "capital": lambda t: ("lookup_capital", {"country": "Zubrowka"}) if t == 0 else None,
    "disallowed": lambda t: ("add", {"a": 1, "b": 2}) if t == 0 else None,
    "failing": lambda t: ("fail_always", {}) if t == 0 else None,
    "sleepy": lambda t: ("sleep_forever", {}) if t == 0 else None,
    "forever": lambda t: ("lookup_capital", {"country": "Freedonia"}),
    "twice": lambda t: [("lookup_capital", {"country": "Zubrowka"}),
                        ("lookup_capital", {"country": "Freedonia"})][t] if t < 2 else None,
}


def script(req: GenerationRequest) -> list[str]:
    """The fake model: a Hermes call for this turn of the scenario, else 'Answer: ' + the last tool result."""
    prompt = "".join(chr(t) for t in req.prompt_tokens if t > 2)
    user = prompt.rsplit("<|user|>", 1)[-1].split("\n", 1)[0]
    scenario = next((s for s in SCENARIOS if s in user), None)
    results = re.findall(r"<\|tool\|>(.*)", prompt)
    call = SCENARIOS[scenario](len(results)) if scenario else None
    if call is not None:
        body = json.dumps({"name": call[0], "arguments": call[1]})
        return ["<tool", "_call>\n", body[:10], body[10:], "\n</tool_call>"]
    words = ["Answer:", *(f" {w}" for w in (results[-1] if results else "no tools").split(" "))]
    return words


def config_text(call_log: Path, url: str, helper_tools: list[str]) -> str:
    return yaml.safe_dump({
        "server": {"api_key": KEY},
        "models": {"m1": {"path": smollm2_path()}},  # served by the fake factory: the file only has to exist
        "mcp_servers": {"caps": stdio_entry(call_log), "web": {"url": url}},
        "assistants": {
            "helper": {"model": "m1", "system": "You have tools.", "tools": {"caps": helper_tools},
                       "max_steps": 2, "tool_timeout_s": 1.5, "max_result_chars": 400},
            "webby": {"model": "m1", "tools": {"web": ["lookup_capital"]}},
        },
    })


HELPER_TOOLS = ["lookup_capital", "fail_always", "sleep_forever"]


@dataclass
class Live:
    url: str
    config_path: Path
    call_log: Path
    http_log: Path
    web_url: str
    factory: FakeFactory
    mcp_log: Lines

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("assistants")
    call_log, http_log = tmp / "stdio-calls.jsonl", tmp / "http-calls.jsonl"
    lines = Lines()
    lines.setLevel(logging.INFO)  # the servers' stderr lines are INFO
    logging.getLogger("gmlx.mcp").addHandler(lines)
    logging.getLogger("gmlx.mcp").setLevel(logging.INFO)
    with http_server(http_log, tmp) as web_url:
        path = tmp / "gmlx.yaml"
        path.write_text(config_text(call_log, web_url, HELPER_TOOLS))
        factory = FakeFactory(behavior=FakeBehavior(script=script), template_text=HERMES_TEXT)
        app = create_app(load_config(str(path)), factory, check_headers=False)
        with ThreadedServer(app) as url:
            yield Live(url, path, call_log, http_log, web_url, factory, lines)
    logging.getLogger("gmlx.mcp").removeHandler(lines)
