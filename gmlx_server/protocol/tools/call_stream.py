"""Incremental tool-call extraction from generated text, for any marker-delimited format.

A call is buffered whole, from its opening marker to its end, and only then emitted (start, the
arguments as one JSON fragment, end): its arguments must be valid JSON to become a call, and a
streamed fragment could not be taken back once the rest turns out malformed, so a malformed call
comes out as text instead. Under a call grammar the call is valid by construction, and its arguments
stream as they are written (args_stream.py). Text that could be the beginning of a marker is held back until it can't,
and whitespace right before or after a call is dropped (a reply of calls alone has no text).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gmlx_server.engine.tool_syntax import ToolSyntax
from gmlx_server.protocol.tools.args_stream import ArgsStream
from gmlx_server.protocol.tools.parse_events import (
    ParsedCall,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolEvent,
)

Tools = Sequence[Mapping[str, Any]] | None
BodyParser = Callable[[str, Tools], list[ParsedCall]]  # raises ValueError on a malformed body
BodyEnd = Callable[[str], int | None]  # length of the complete body at the start of the text, None: not yet

_LEAD_GAP = re.compile(r"\s*")
_BETWEEN_CALLS = re.compile(r"[\s;]*")  # Llama 3 separates parallel JSON calls with ';' or newlines


@dataclass(frozen=True)
class ToolFormat:
    """One tool-call syntax (its markers, from the engine's table) and how its body becomes calls."""

    syntax: ToolSyntax
    parse: BodyParser
    body_end: BodyEnd | None = None  # where a call without a closing marker ends

    @property
    def name(self) -> str:
        return self.syntax.name

    @property
    def starts(self) -> tuple[str, ...]:
        return self.syntax.starts

    @property
    def end(self) -> str | None:
        return self.syntax.end

    @property
    def leading_json(self) -> bool:
        return self.syntax.leading_json

    @property
    def stop(self) -> tuple[str, ...]:
        return self.syntax.stop

    def streaming(self, tools: Tools = None, new_id: Callable[[], str] | None = None,
                  stream_args: bool = False) -> ToolStreamParser:
        """A parser for one response; `tools` are the request's (some formats read argument types there).
        `stream_args`: a call grammar holds the reply, so a call's arguments stream as they are written."""
        return ToolStreamParser(self, tools, new_id or new_call_id, stream_args)

    def parse_text(self, text: str, tools: Tools = None) -> tuple[str, list[ParsedCall]]:
        """Whole-text convenience: (the text outside calls, the calls)."""
        parser = self.streaming(tools)
        events = parser.feed(text) + parser.finish()
        shown = "".join(e.text for e in events if isinstance(e, TextDelta))
        names = {e.index: e.name for e in events if isinstance(e, ToolCallStart)}
        return shown, [ParsedCall(names[e.index], e.arguments) for e in events if isinstance(e, ToolCallEnd)]


def new_call_id() -> str:
    return secrets.token_hex(12)


class CallParser(Protocol):
    """What reads one reply's calls: text deltas in, events out; counts for the finish reason and the log."""

    @property
    def calls(self) -> int: ...

    @property
    def failed(self) -> int: ...

    def feed(self, text: str) -> list[ToolEvent]: ...

    def finish(self) -> list[ToolEvent]: ...


class ToolStreamParser:
    """feed(text delta) -> events; finish() at the end of generation flushes what was held back."""

    def __init__(self, fmt: ToolFormat, tools: Tools, new_id: Callable[[], str], stream_args: bool = False) -> None:
        self._fmt, self._tools, self._new_id = fmt, tools, new_id
        self._stream_args = stream_args
        self._args: ArgsStream | None = None  # the open call's arguments as they stream
        self._buf = ""
        self._opener: str | None = None  # set while inside a call: the text that opened it
        self._bare = False  # the open call is a bare JSON object (no marker): not a call is no failure
        self._pending_ws = ""  # whitespace withheld: dropped if a call follows it
        self._after_call = False  # whitespace right after a call is dropped too
        self._boundary = fmt.leading_json  # here a bare JSON object would be a call
        self._calls = 0
        self._failed = 0

    @property
    def calls(self) -> int:
        """How many calls were parsed so far (the protocol's finish reason: tool_calls when > 0)."""
        return self._calls

    @property
    def failed(self) -> int:
        """How many opened calls did not parse (each came out as text)."""
        return self._failed

    def feed(self, text: str) -> list[ToolEvent]:
        self._buf += text
        out: list[ToolEvent] = []
        while self._step(out):
            pass
        return _merged(out)

    def finish(self) -> list[ToolEvent]:
        out: list[ToolEvent] = []
        while self._step(out):
            pass
        if self._opener is not None:  # an unclosed call: it still counts if its body parses
            body, self._buf = self._buf, ""
            self._close(out, body, self._opener + body)
        elif self._buf:
            self._text(out, self._buf)
            self._buf = ""
        if self._pending_ws and not self._after_call:
            out.append(TextDelta(self._pending_ws))
        self._pending_ws = ""
        return _merged(out)

    def _step(self, out: list[ToolEvent]) -> bool:
        """Consume what can be decided now; True when there may be more to do."""
        if self._opener is not None:
            return self._step_call(out)
        if self._boundary:
            return self._step_leading_json()
        return self._step_text(out)

    def _step_leading_json(self) -> bool:
        """At a boundary: open a call on '{'; keep waiting on a gap; otherwise leave the boundary."""
        gap = (_BETWEEN_CALLS if self._after_call else _LEAD_GAP).match(self._buf)
        n = gap.end() if gap else 0
        if n == len(self._buf):
            return False  # only a gap so far: wait
        if self._buf[n] == "{":
            self._open(self._buf[:n], n, bare=True)
            return True
        self._boundary = False
        return True

    def _step_text(self, out: list[ToolEvent]) -> bool:
        hit = _first_marker(self._buf, self._fmt.starts)
        if hit is not None:
            at, marker = hit
            self._text(out, self._buf[:at])
            self._open(marker, at + len(marker))
            return True
        keep = _partial_marker_len(self._buf, self._fmt.starts)
        self._text(out, self._buf[: len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep :]
        return False

    def _step_call(self, out: list[ToolEvent]) -> bool:
        opener = self._opener or ""
        if self._args is not None:
            self._stream(out)
        if self._fmt.end is not None:
            at = self._buf.find(self._fmt.end)
            if at < 0:
                return False
            body, raw, rest = self._buf[:at], opener + self._buf[: at + len(self._fmt.end)], at + len(self._fmt.end)
        else:
            n = self._fmt.body_end(self._buf) if self._fmt.body_end else None
            if n is None:
                return False
            body, raw, rest = self._buf[:n], opener + self._buf[:n], n
        self._buf = self._buf[rest:]
        self._close(out, body, raw)
        return True

    def _open(self, marker: str, consumed: int, bare: bool = False) -> None:
        self._opener = self._pending_ws + marker  # the raw text, should the call turn out malformed
        self._bare = bare
        self._args = ArgsStream() if self._stream_args else None
        self._pending_ws = ""
        self._buf = self._buf[consumed:]

    def _stream(self, out: list[ToolEvent]) -> None:
        """A constrained call's name once known, then its argument text as it comes."""
        assert self._args is not None
        named, fragment = self._args.feed(self._buf)
        if named is not None:
            out.append(ToolCallStart(self._calls, self._new_id(), named))
        if fragment:
            out.append(ToolCallArgsDelta(self._calls, fragment))

    def _close(self, out: list[ToolEvent], body: str, raw: str) -> None:
        self._opener = None
        try:
            calls = self._fmt.parse(body, self._tools)
        except ValueError:
            calls = []
        self._boundary = self._fmt.leading_json and bool(calls)
        streamed, self._args = self._args is not None and self._args.name is not None, None
        if streamed:  # announced already: it ends, cut short by max_tokens with what it had, or whole
            index = self._calls
            self._calls += len(calls) == 1
            self._failed += len(calls) != 1
            out.append(ToolCallEnd(index, calls[0].arguments if len(calls) == 1 else {}))
            self._after_call = True
            return
        if not calls:
            self._failed += not self._bare
            self._text(out, raw)
            return
        for call in calls:
            index, self._calls = self._calls, self._calls + 1
            out += [ToolCallStart(index, self._new_id(), call.name),
                    ToolCallArgsDelta(index, json.dumps(call.arguments, ensure_ascii=False)),
                    ToolCallEnd(index, call.arguments)]
        self._after_call = True

    def _text(self, out: list[ToolEvent], text: str) -> None:
        """Emit text, withholding trailing whitespace and dropping whitespace that follows a call."""
        text = self._pending_ws + text
        if self._after_call:
            text = text.lstrip()
            self._after_call = not text
        body = text.rstrip()
        self._pending_ws = text[len(body) :]
        if body:
            out.append(TextDelta(body))


def _first_marker(text: str, markers: tuple[str, ...]) -> tuple[int, str] | None:
    found = [(at, m) for m in markers if (at := text.find(m)) >= 0]
    return min(found, key=lambda hit: (hit[0], -len(hit[1]))) if found else None


def _partial_marker_len(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of text that is a proper prefix of a marker."""
    best = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:size]):
                best = size
                break
    return best


def _merged(events: list[ToolEvent]) -> list[ToolEvent]:
    out: list[ToolEvent] = []
    for event in events:
        if isinstance(event, TextDelta) and out and isinstance(out[-1], TextDelta):
            out[-1] = TextDelta(out[-1].text + event.text)
        else:
            out.append(event)
    return out
