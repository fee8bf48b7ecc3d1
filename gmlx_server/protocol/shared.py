"""What the Anthropic and Responses converters share: the chat-template structures both turn into
(transformers' convention: assistant `tool_calls`, `tool` role messages) and the output pieces
(tool calls, token tallies) both encoders turn back into their wire format.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gmlx_server.engine.types import TokenEvent
from gmlx_server.errors import GmlxError
from gmlx_server.protocol.image_parts import join_content
from gmlx_server.protocol.openai import arguments_value

# (SSE event name, JSON payload); OpenAI streams unnamed events ("") and ends with the raw text [DONE].
Event = tuple[str, dict[str, Any] | str]


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


# --- input side: the template's messages and tools ----------------------------------------------

def tool_function(name: str, description: Any, parameters: Any) -> dict[str, Any]:
    """A tool as chat templates expect it ({"type": "function", "function": {...}})."""
    fn: dict[str, Any] = {"name": name, "parameters": parameters if parameters is not None else {}}
    if isinstance(description, str) and description:
        fn["description"] = description
    return {"type": "function", "function": fn}


def tool_call_entry(call_id: str, name: str, arguments: Any, where: str) -> dict[str, Any]:
    """An assistant tool call; JSON-string arguments (`where.arguments`) become objects, as templates expect."""
    args = arguments_value(arguments, f"{where}.arguments") if isinstance(arguments, str) else arguments
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _merge(prev: dict[str, Any], cur: Mapping[str, Any]) -> None:
    prev["content"] = join_content(prev.get("content"), cur.get("content"))
    calls = [*prev.get("tool_calls", ()), *cur.get("tool_calls", ())]
    if calls:
        prev["tool_calls"] = calls
    thoughts = [t for t in (prev.get("reasoning_content"), cur.get("reasoning_content")) if t]
    if thoughts:
        prev["reasoning_content"] = "\n".join(thoughts)


def merge_turns(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive user (or assistant) turns become one, as Anthropic and OpenAI combine them;
    many templates reject two turns of the same role in a row."""
    out: list[dict[str, Any]] = []
    for msg in messages:
        prev = out[-1] if out else None
        if prev is not None and prev["role"] == msg["role"] and msg["role"] in ("user", "assistant"):
            _merge(prev, msg)
        else:
            out.append(dict(msg))
    return out


def name_tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give each tool message the name of the call it answers (some templates print it)."""
    names: dict[str, str] = {}
    for msg in messages:
        for call in msg.get("tool_calls", ()):
            names[call.get("id")] = call["function"]["name"]
        if msg["role"] == "tool" and "name" not in msg and msg.get("tool_call_id") in names:
            msg["name"] = names[msg["tool_call_id"]]
    return messages


# --- output side -------------------------------------------------------------------------------

@dataclass(frozen=True)
class ToolCall:
    """A tool call parsed from the model's output; encoders emit it as their protocol's tool block."""

    name: str
    arguments: str  # JSON text
    id: str = ""  # the parser's opaque id (the encoder adds its protocol's prefix), else a new one


def arguments_object(arguments: str) -> Any:
    """Parsed arguments for a non-streamed body; text that is not JSON stays a string."""
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return arguments


class Tally:
    """Generated tokens and the final event, counted the same way by every encoder."""

    def __init__(self) -> None:
        self.generated = 0
        self.final: TokenEvent | None = None

    def count(self, ev: TokenEvent) -> None:
        if ev.token_id is not None:
            self.generated += 1
        if ev.finish_reason is not None:
            self.final = ev
            if ev.timings is not None:
                self.generated = max(self.generated, ev.timings.generated)

    @property
    def cached(self) -> int:
        """Prompt tokens the engine's prompt cache supplied (known with the final event)."""
        t = self.final.timings if self.final is not None else None
        return t.cached_tokens if t is not None else 0

    @staticmethod
    def ends_well(ev: TokenEvent) -> bool:
        """A final event the encoder closes normally (an error or a shed goes through fail())."""
        return ev.finish_reason is not None and ev.finish_reason not in ("error", "shed")


class TextFeed:
    """feed() shared by encoders whose events are text until a final event that ended well."""

    tally: Tally

    def text(self, text: str) -> list[Event]:
        raise NotImplementedError

    def _finish(self, ev: TokenEvent) -> list[Event]:
        raise NotImplementedError

    def feed(self, ev: TokenEvent) -> list[Event]:
        self.tally.count(ev)
        events = self.text(ev.text)
        if Tally.ends_well(ev):
            events += self._finish(ev)
        return events


class EventEncoder(Protocol):
    """One request's output in a protocol's terms: events to stream, and the whole body.

    A tool-call parser's events map one to one: text -> text(), a call's start, argument
    fragments and end -> tool_start(), tool_arguments(), tool_end(); the stop reason then says so.
    """

    def start(self) -> list[Event]: ...

    def feed(self, ev: TokenEvent) -> list[Event]: ...

    def text(self, text: str) -> list[Event]: ...

    def tool_start(self, call_id: str, name: str) -> list[Event]: ...

    def tool_arguments(self, fragment: str) -> list[Event]: ...

    def tool_end(self, arguments: Any = None) -> list[Event]: ...

    def fail(self, err: GmlxError) -> list[Event]: ...

    def body(self) -> dict[str, Any]: ...


class Forwarding:
    """An EventEncoder wrapper's pass-through: everything but feed() goes to `inner` unchanged."""

    inner: EventEncoder

    def start(self) -> list[Event]:
        return self.inner.start()

    def text(self, text: str) -> list[Event]:
        return self.inner.text(text)

    def tool_start(self, call_id: str, name: str) -> list[Event]:
        return self.inner.tool_start(call_id, name)

    def tool_arguments(self, fragment: str) -> list[Event]:
        return self.inner.tool_arguments(fragment)

    def tool_end(self, arguments: Any = None) -> list[Event]:
        return self.inner.tool_end(arguments)

    def fail(self, err: GmlxError) -> list[Event]:
        return self.inner.fail(err)

    def body(self) -> dict[str, Any]:
        return self.inner.body()
