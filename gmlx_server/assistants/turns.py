"""One model turn of an assistant's loop, read as it streams: the text a client may see, and the calls.

The reply runs through the parser of the turn's tool-call syntax (the same parsers that turn calls into
OpenAI tool_calls and Anthropic tool_use blocks), so a call's markup never reaches the client. One leniency,
as llama.cpp reads Hermes replies: a turn whose whole text is one JSON object naming one of the offered tools
with an arguments object (bare, or in a ```json fence) is that call. Qwen2.5-Coder writes its calls so, without
the <tool_call> tags its template asks for. Such a turn's text is held until the turn ends.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gmlx_server.engine.tool_syntax import ToolUse
from gmlx_server.protocol.tools import TextDelta, ToolCallEnd, ToolCallStart, ToolEvent, format_of


@dataclass(frozen=True)
class Call:
    call_id: str
    name: str
    arguments: Mapping[str, Any]


_FENCE = re.compile(r"\s*```(?:json)?\s*(.*?)\s*```\s*", re.DOTALL)


class TurnReader:
    """feed() the turn's text deltas, finish() at its final event; both return the text to show."""

    def __init__(self, use: ToolUse | None, tools: Sequence[Mapping[str, Any]] | None) -> None:
        self.use = use
        self.parser = format_of(use.syntax).streaming(tools) if use is not None else None
        self.offered = {t["function"]["name"] for t in tools or () if isinstance(t.get("function"), Mapping)}
        self.calls: list[Call] = []
        self.shown: list[str] = []
        self._open: dict[int, ToolCallStart] = {}
        self._held: str | None = None  # the turn's text so far, while it may be a bare JSON call

    def feed(self, text: str) -> str:
        return self._take(self.parser.feed(text)) if self.parser is not None else self._show(text)

    def finish(self) -> str:
        if self.parser is None:
            return ""
        text = self._take(self.parser.finish())
        held, self._held = self._held, None
        bare = bare_call(held, self.offered) if held is not None else None
        if bare is not None:
            self.calls.append(bare)
        elif held is not None:  # not a call after all: the text it was, now
            self.shown.append(held)
            text = held + text
        if self.use is not None and self.use.report is not None:  # gmlx_tool_calls_total, as for any reply
            self.use.report(self.parser.calls + (bare is not None), self.parser.failed)
        return text

    @property
    def format_stops(self) -> tuple[str, ...]:
        """Stop strings the syntax added: ours, not the client's (the answer reports no stop_sequence)."""
        return self.use.syntax.stop if self.use is not None else ()

    def _take(self, events: list[ToolEvent]) -> str:
        out = []
        for e in events:
            if isinstance(e, TextDelta):
                out.append(e.text)
            elif isinstance(e, ToolCallStart):
                self._open[e.index] = e
            elif isinstance(e, ToolCallEnd):
                start = self._open.pop(e.index)
                self.calls.append(Call(f"call_{start.id}", start.name, e.arguments))
        return self._show("".join(out))

    def _show(self, text: str) -> str:
        if self._held is not None or (self.offered and self.parser is not None and not self.shown and not self.calls):
            text, self._held = (self._held or "") + text, None
            if _may_be_bare(text):
                self._held = text
                return ""
        if text:
            self.shown.append(text)
        return text

    def assistant_message(self) -> dict[str, Any]:
        """The turn as the template's history: its text and its calls (arguments as objects)."""
        calls = [{"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}}
                 for c in self.calls]
        return {"role": "assistant", "content": "".join(self.shown), "tool_calls": calls}


def bare_call(text: str, offered: set[str]) -> Call | None:
    """The call a turn's whole text makes as a bare (or fenced) JSON object, or None."""
    fenced = _FENCE.fullmatch(text)
    try:
        data = json.loads(fenced.group(1) if fenced else text)
    except ValueError:
        return None
    arguments = data.get("arguments", data.get("parameters")) if isinstance(data, dict) else None
    if not isinstance(arguments, dict) or data.get("name") not in offered:
        return None
    return Call(f"call_{secrets.token_hex(12)}", data["name"], arguments)


def _may_be_bare(text: str) -> bool:
    start = text.lstrip()
    return start.startswith(("{", "```json")) or "```json".startswith(start)
