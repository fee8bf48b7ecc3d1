"""Calls a model writes without its template's markers, read as calls when tools are offered.

Small models often answer a tool request with the call alone, but not in the template's form: a bare JSON
object of the call shape, the same in a fenced ```json block, or the markers with a case or whitespace slip
(`<Tool_Call>`, `< /tool_call>`). Two readers in front of the syntax's own parser:

- slipped markers are written back as the template's before the parser sees them (anywhere in the reply);
- a reply that is nothing but bare or fenced JSON calls of offered tools (one object, a list, or one object per
  line) becomes those calls. While the reply may still be one it is held back; anything else is shown as it comes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from gmlx_server.protocol.tools.call_stream import ToolFormat, Tools, ToolStreamParser
from gmlx_server.protocol.tools.parse_events import ToolCallArgsDelta, ToolCallEnd, ToolCallStart, ToolEvent

_DECODER = json.JSONDecoder()
_FENCE = re.compile(r"```[ \t]*(json)?[ \t]*\n", re.IGNORECASE)


def _squash(text: str) -> str:
    return "".join(text.split()).lower()


def _slip_pattern(marker: str) -> re.Pattern[str]:
    """The marker with any whitespace between its characters, in any case."""
    return re.compile(r"\s*".join(re.escape(ch) for ch in marker), re.IGNORECASE)


class MarkerSlips:
    """Rewrites slipped markers to the template's own; text that may be the start of one is held back."""

    def __init__(self, markers: tuple[str, ...]) -> None:
        self._markers = tuple(m for m in markers if m)
        self._patterns = [(_slip_pattern(m), m) for m in self._markers]
        self._squashed = [_squash(m) for m in self._markers]
        self._heads = {m[0] for m in self._markers}
        self._buf = ""

    def feed(self, text: str) -> str:
        self._buf += text
        keep = self._held_from()
        ready, self._buf = self._buf[:keep], self._buf[keep:]
        return self._rewrite(ready)

    def finish(self) -> str:
        rest, self._buf = self._buf, ""
        return self._rewrite(rest)

    def _rewrite(self, text: str) -> str:
        for pattern, marker in self._patterns:
            text = pattern.sub(marker, text)
        return text

    def _held_from(self) -> int:
        """Where the tail that could still become a (slipped) marker starts; len(buf): none."""
        for at in range(max(0, len(self._buf) - 64), len(self._buf)):
            if self._buf[at] not in self._heads:
                continue
            tail = _squash(self._buf[at:])
            if any(s.startswith(tail) and len(tail) < len(s) for s in self._squashed):
                return at
        return len(self._buf)


def offered_names(tools: Tools) -> frozenset[str]:
    names = (t.get("function", {}).get("name") for t in tools or () if isinstance(t.get("function"), dict))
    return frozenset(n for n in names if isinstance(n, str))


def bare_calls(body: Any, names: frozenset[str]) -> list[tuple[str, dict[str, Any]]] | None:
    """`{"name": ..., "arguments" | "parameters": {...}}` (or a list of them) naming offered tools, else None."""
    items = body if isinstance(body, list) else [body]
    out = []
    for item in items:
        if not isinstance(item, dict) or item.get("name") not in names:
            return None
        args = next((item[k] for k in ("arguments", "parameters") if k in item), None)
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict) or set(item) - {"name", "arguments", "parameters", "type", "id"}:
            return None
        out.append((item["name"], args))
    return out or None


class LenientCalls:
    """A tool-call parser (ToolStreamParser's interface) that also reads calls written without markers."""

    def __init__(self, fmt: ToolFormat, tools: Tools, new_id: Callable[[], str], constrained: bool = False) -> None:
        self._inner: ToolStreamParser = fmt.streaming(tools, new_id, stream_args=constrained)
        self._slips = MarkerSlips((*fmt.starts, *((fmt.end,) if fmt.end else ())))
        self._names, self._new_id = offered_names(tools), new_id
        # The reply so far while it may be bare calls; None: it is not. A call grammar allows only its own shape.
        self._held: str | None = None if constrained else ""
        self._found = 0

    @property
    def calls(self) -> int:
        return self._inner.calls + self._found

    @property
    def failed(self) -> int:
        return self._inner.failed

    def feed(self, text: str) -> list[ToolEvent]:
        if self._held is None:
            return self._inner.feed(self._slips.feed(text))
        self._held += text
        if self._could_be_call(self._held):
            return []
        held, self._held = self._held, None
        return self._inner.feed(self._slips.feed(held))

    def finish(self) -> list[ToolEvent]:
        if self._held is not None:
            held, self._held = self._held, None
            calls = self._whole_call(held)
            if calls is not None:
                return self._emit(calls)
            return self._inner.feed(self._slips.feed(held)) + self._finish_inner()
        return self._finish_inner()

    def _finish_inner(self) -> list[ToolEvent]:
        rest = self._slips.finish()
        return (self._inner.feed(rest) if rest else []) + self._inner.finish()

    def _emit(self, calls: list[tuple[str, dict[str, Any]]]) -> list[ToolEvent]:
        out: list[ToolEvent] = []
        for name, args in calls:
            index, self._found = self._found, self._found + 1
            out += [ToolCallStart(index, self._new_id(), name),
                    ToolCallArgsDelta(index, json.dumps(args, ensure_ascii=False)), ToolCallEnd(index, args)]
        return out

    def _could_be_call(self, text: str) -> bool:
        """Still possibly exactly bare or fenced calls: JSON values in the making, or calls just complete."""
        s = text.lstrip()
        if not s:
            return True
        if s.startswith("`"):
            if len(s) < 3 or "\n" not in s:
                return "```".startswith(s[:3]) and (len(s) < 3 or _squash(s[3:]) in ("", "j", "js", "jso", "json"))
            fence = _FENCE.match(s)
            if fence is None:
                return False
            s = s[fence.end():]
        at, seen = 0, 0
        while True:
            at += len(s[at:]) - len(s[at:].lstrip())
            if at == len(s):
                return True
            if s[at] not in "{[":
                return seen > 0 and "```".startswith(s[at:].rstrip())  # the closing fence
            try:
                value, at = _DECODER.raw_decode(s, at)
            except json.JSONDecodeError:
                return True  # not complete yet (a malformed one shows at the end)
            if bare_calls(value, self._names) is None:
                return False
            seen += 1

    def _whole_call(self, text: str) -> list[tuple[str, dict[str, Any]]] | None:
        """The calls of a reply that is nothing but bare JSON calls (one per value), fenced or not."""
        s = text.strip()
        fence = _FENCE.match(s)
        if fence is not None:
            if not s.endswith("```"):
                return None
            s = s[fence.end():-3].strip()
        calls: list[tuple[str, dict[str, Any]]] = []
        at = 0
        while at < len(s):
            try:
                value, at = _DECODER.raw_decode(s, at)
            except json.JSONDecodeError:
                return None
            found = bare_calls(value, self._names)
            if found is None:
                return None
            calls += found
            at += len(s[at:]) - len(s[at:].lstrip())
        return calls or None
