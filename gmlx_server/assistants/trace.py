"""How clients see an assistant's tool calls: a `tool_trace` list (each finished call: step, id, tool, server,
arguments, ok, result, error, duration_s) in the answer's object, and while streaming one event per call as
it finishes, in a form each official SDK passes by without breaking:

    chat        a chunk {"object": "chat.completion.chunk", "choices": [], "tool_trace": [CALL]}
    anthropic   event: tool_trace      data: {"type": "tool_trace", "step": CALL}
    responses   event: response.tool_trace   data: {"type": "response.tool_trace", "step": CALL, ...}

Responses events are numbered again (the inner encoder's sequence_number), and the response object in
response.completed carries `tool_trace` too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from gmlx_server.assistants.loop import AssistantStarted, Trace
from gmlx_server.engine.types import TokenEvent
from gmlx_server.errors import GmlxError
from gmlx_server.protocol.shared import Event, EventEncoder
from gmlx_server.serving.generation import Started

Style = Literal["chat", "anthropic", "responses"]


class TraceEncoder:
    """An EventEncoder that shows the trace's new calls before each event of `inner`'s."""

    def __init__(self, inner: EventEncoder, trace: Trace, style: Style, head: Mapping[str, Any]) -> None:
        self.inner, self.trace, self.style, self.head = inner, trace, style, dict(head)
        self._seq = 0

    def _calls(self) -> list[Event]:
        out: list[Event] = []
        for step in self.trace.unshown():
            if self.style == "chat":
                out.append(("", {**self.head, "object": "chat.completion.chunk", "choices": [], "tool_trace": [step]}))
            elif self.style == "anthropic":
                out.append(("tool_trace", {"type": "tool_trace", "step": step}))
            else:
                out.append(("response.tool_trace", {"type": "response.tool_trace", "step": step}))
        return out

    def _out(self, events: list[Event]) -> list[Event]:
        if self.style != "responses":
            return events
        for _, payload in events:
            if isinstance(payload, dict):
                payload["sequence_number"], self._seq = self._seq, self._seq + 1
                if isinstance(payload.get("response"), dict):
                    payload["response"]["tool_trace"] = list(self.trace.steps)
        return events

    def start(self) -> list[Event]:
        return self._out(self.inner.start())

    def feed(self, ev: TokenEvent) -> list[Event]:
        return self._out(self._calls() + self.inner.feed(ev))

    def text(self, text: str) -> list[Event]:
        return self._out(self.inner.text(text))

    def tool_start(self, call_id: str, name: str) -> list[Event]:
        return self._out(self.inner.tool_start(call_id, name))

    def tool_arguments(self, fragment: str) -> list[Event]:
        return self._out(self.inner.tool_arguments(fragment))

    def tool_end(self, arguments: Any = None) -> list[Event]:
        return self._out(self.inner.tool_end(arguments))

    def fail(self, err: GmlxError) -> list[Event]:
        return self._out(self._calls() + self.inner.fail(err))

    def body(self) -> dict[str, Any]:
        return {**self.inner.body(), "tool_trace": list(self.trace.steps)}


def with_trace(encoder: EventEncoder, started: Started, style: Style,
               head: Mapping[str, Any] | None = None) -> EventEncoder:
    """`encoder` as is, unless the answer comes from an assistant's loop; `head` is what a chat chunk repeats
    (id, created, model)."""
    if not isinstance(started, AssistantStarted):
        return encoder
    return TraceEncoder(encoder, started.trace, style, head or {})
