"""Assistants on the real Qwen2.5-Coder Instruct models (their Hermes tool template) behind a real `gmlx serve`:
the model calls lookup_capital for a made-up country, the server runs it on the SDK-written test MCP server
(stdio, and streamable HTTP), and the answer carries a capital the model cannot know. Over real HTTP with the
official openai and anthropic SDKs, streamed and not; greedy and short.

The 1.5B model runs the whole loop. The 0.5B model makes the call of its own accord (as a bare JSON object,
which the loop reads) and the server runs it, but it cannot answer from a tool result: given one, it writes
the call again (greedy, with or without a system prompt, penalties or gmlx's JSON convention), so its answer
is not checked.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.assistants.tools_server import calls, http_server, stdio_entry
from tests.conftest import qwen_coder_path
from tests.e2e.server import LiveServer, anthropic_client, gmlx_serve, openai_client

pytestmark = pytest.mark.slow
QUESTION = [{"role": "user", "content": "What is the capital of Zubrowka?"}]
SYSTEM = "Answer questions about capitals with the lookup_capital tool, then say what it returned."
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 96}
ANTHROPIC_GREEDY: dict[str, Any] = {"max_tokens": 96, "extra_body": {"temperature": 0}}  # no sampling arguments


@dataclass
class Served:
    server: LiveServer
    stdio_log: Path
    http_log: Path


def config(stdio_log: Path, url: str) -> dict[str, Any]:
    """Left to itself the 1.5B model spells its first call `{{...}}` half the time: `tool_choice: required`
    holds that turn to a call (its arguments are the model's); the small model's first turn is its own."""
    tools = {"system": SYSTEM, "max_steps": 2, "tool_timeout_s": 30, "tool_choice": "required"}
    return {"models": {"qwen": {"path": qwen_coder_path("1.5b")}, "small": {"path": qwen_coder_path("0.5b")}},
            "mcp_servers": {"caps": stdio_entry(stdio_log), "web": {"url": url}},
            "assistants": {"capitals": {"model": "qwen", "tools": {"caps": ["lookup_capital"]}, **tools},
                           "capitals-web": {"model": "qwen", "tools": {"web": ["lookup_capital"]}, **tools},
                           "capitals-small": {"model": "small", "tools": {"caps": ["lookup_capital"]}, **tools,
                                              "tool_choice": "auto"}}}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("assistant-real")
    stdio_log, http_log = tmp / "stdio.jsonl", tmp / "http.jsonl"
    with http_server(http_log, tmp) as url:
        path = tmp / "gmlx.yaml"
        path.write_text(yaml.safe_dump(config(stdio_log, url)))
        with gmlx_serve(["--config", str(path)], tmp, timeout_s=300) as server:
            yield Served(server, stdio_log, http_log)


def ran_lookup(log: Path, before: int) -> None:
    new = calls(log)[before:]
    assert new and all(c["tool"] == "lookup_capital" for c in new)
    assert any("zubrowka" in c["arguments"]["country"].lower() for c in new), new


def test_openai_sdk(served: Served) -> None:
    client, before = openai_client(served.server), len(calls(served.stdio_log))
    done = client.chat.completions.create(model="capitals", messages=QUESTION, **GREEDY)  # type: ignore[arg-type]
    ran_lookup(served.stdio_log, before)
    assert "Lutz" in (done.choices[0].message.content or "") and done.model == "capitals"
    assert (done.model_extra or {})["tool_trace"][0]["result"] == "The capital of Zubrowka is Lutz."
    before = len(calls(served.stdio_log))
    chunks = list(client.chat.completions.create(model="capitals", messages=QUESTION, stream=True,  # type: ignore[call-overload]
                                                 **GREEDY))
    ran_lookup(served.stdio_log, before)
    assert any((c.model_extra or {}).get("tool_trace") for c in chunks)
    assert "Lutz" in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_anthropic_sdk(served: Served) -> None:
    client, before = anthropic_client(served.server), len(calls(served.stdio_log))
    msg = client.messages.create(model="capitals", messages=QUESTION, **ANTHROPIC_GREEDY)  # type: ignore[arg-type]
    ran_lookup(served.stdio_log, before)
    assert msg.content[0].type == "text" and "Lutz" in msg.content[0].text
    before = len(calls(served.stdio_log))
    with client.messages.stream(model="capitals", messages=QUESTION, **ANTHROPIC_GREEDY) as stream:  # type: ignore[arg-type]
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    ran_lookup(served.stdio_log, before)
    assert "tool_trace" in kinds and "Lutz" in "".join(b.text for b in final.content if b.type == "text")


def test_streamable_http_server_with_responses(served: Served) -> None:
    client, before = openai_client(served.server), len(calls(served.http_log))
    done = client.responses.create(model="capitals-web", input="What is the capital of Zubrowka?",
                                   temperature=0, max_output_tokens=96)
    ran_lookup(served.http_log, before)
    assert "Lutz" in done.output_text and (done.model_extra or {})["tool_trace"][0]["server"] == "web"


def test_the_small_model_calls_the_tool_and_the_server_runs_it(served: Served) -> None:
    client, before = openai_client(served.server), len(calls(served.stdio_log))
    done = client.chat.completions.create(model="capitals-small", messages=QUESTION, **GREEDY)  # type: ignore[arg-type]
    ran_lookup(served.stdio_log, before)
    step = (done.model_extra or {})["tool_trace"][0]
    assert step["ok"] is True and step["result"] == "The capital of Zubrowka is Lutz."


def test_gmlx_serve_refuses_to_start_on_a_tool_the_server_does_not_list(tmp_path: Path) -> None:
    cfg = config(tmp_path / "calls.jsonl", "http://127.0.0.1:9/mcp")
    cfg["mcp_servers"].pop("web")
    cfg["assistants"] = {"capitals": {"model": "qwen", "tools": {"caps": ["lookup_capital", "nope"]}}}
    path = tmp_path / "gmlx.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(RuntimeError, match="gmlx serve exited") as err, gmlx_serve(["--config", str(path)], tmp_path):
        pass
    assert "assistants.capitals.tools.caps: MCP server 'caps' does not list 'nope'" in str(err.value)
