"""Tool calls in a reply: the model's text runs through the parser of the request's tool-call syntax (the
template's own, or gmlx's JSON convention), and the parser's events drive any protocol's EventEncoder
(OpenAI tool_calls, Anthropic tool_use blocks, Responses function_call items), streamed or not.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from gmlx_server.engine.tool_syntax import ToolUse
from gmlx_server.engine.types import TokenEvent
from gmlx_server.generation_params import GenerationParams
from gmlx_server.protocol.shared import Event, EventEncoder, Forwarding, Tally
from gmlx_server.protocol.tools import (
    CallParser,
    LenientCalls,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    ToolEvent,
    format_of,
    new_call_id,
)

log = logging.getLogger("gmlx.tools")


class ToolCallEncoder(Forwarding):
    """An EventEncoder that parses tool calls out of the text before `inner` sees it."""

    def __init__(self, inner: EventEncoder, parser: CallParser, params: GenerationParams,
                 use: ToolUse) -> None:
        self.inner, self.parser, self.use = inner, parser, use
        self._choice = params.tool_choice
        self._format_stops = tuple(s for s in use.syntax.stop if s not in params.stop)
        self._one_call = not params.parallel_tool_calls
        self._dropped: set[int] = set()  # calls past the first under parallel_tool_calls false

    def feed(self, ev: TokenEvent) -> list[Event]:
        events = self._render(self.parser.feed(ev.text))
        if ev.finish_reason is not None:
            events += self._render(self.parser.finish())
            self._check_forced(ev)
            if self._dropped:
                log.info("parallel_tool_calls false: %d more call(s) after the first dropped", len(self._dropped))
            if self.use.report is not None:
                self.use.report(self.parser.calls - len(self._dropped), self.parser.failed)
            if ev.stop_string in self._format_stops:  # our stop, not the client's: no stop_sequence
                ev = replace(ev, stop_string=None)
        return events + self.inner.feed(replace(ev, text=""))

    def _render(self, parsed: list[ToolEvent]) -> list[Event]:
        out: list[Event] = []
        for e in parsed:
            if isinstance(e, ToolCallStart) and self._one_call and e.index > 0:
                self._dropped.add(e.index)
            if not isinstance(e, TextDelta) and e.index in self._dropped:
                continue
            if isinstance(e, TextDelta):
                out += self.inner.text(e.text)
            elif isinstance(e, ToolCallStart):
                out += self.inner.tool_start(e.id, e.name)
            elif isinstance(e, ToolCallArgsDelta):
                out += self.inner.tool_arguments(e.json_fragment)
            else:
                out += self.inner.tool_end(e.arguments)
        return out

    def _check_forced(self, ev: TokenEvent) -> None:
        forced = self._choice == "required" or isinstance(self._choice, dict)
        if forced and self.parser.calls == 0 and Tally.ends_well(ev):
            log.warning("tool_choice %s asked for a call, but the model produced none%s", self._choice,
                        " (the constrained call was cut short)" if self.use.constrained
                        else " (the choice was not enforced)")


def parallel_honoured(params: GenerationParams, tools: ToolUse | None) -> bool:
    """What parallel_tool_calls the reply gets: a call grammar holds it to one call whatever was asked."""
    return params.parallel_tool_calls and not (tools is not None and tools.constrained)


def with_tool_calls(encoder: EventEncoder, params: GenerationParams, tools: ToolUse | None) -> EventEncoder:
    """`encoder` as is, unless the reply is read for tool calls (the service's ToolUse says in which syntax)."""
    if tools is None:
        return encoder
    parser = LenientCalls(format_of(tools.syntax), params.tools, new_call_id, tools.constrained)
    return ToolCallEncoder(encoder, parser, params, tools)
