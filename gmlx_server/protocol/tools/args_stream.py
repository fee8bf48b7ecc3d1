"""The arguments of a grammar-constrained call, streamed as the model writes them.

Under a call grammar (engine/tool_grammar.py) the body after the marker is `{"name": NAME, KEY: ARGS}` and
valid by construction, so ARGS can be shown piece by piece: the name once it is closed, then every character
of the arguments' JSON value as it comes (the whitespace before the value is not part of it). A string scan
of depth and quoting says where the value ends; nothing after it is arguments.
"""

from __future__ import annotations

import json
import re

_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*')


class ArgsStream:
    """feed(the call's body so far) -> (the name, when it just became known; the new argument text)."""

    def __init__(self) -> None:
        self.name: str | None = None
        self._at = 0  # where the scan of the body has reached
        self._depth = 0
        self._in_string = self._escaped = False
        self._started = False  # the value's first character has been seen
        self.done = False  # the arguments' value is complete

    def feed(self, body: str) -> tuple[str | None, str]:
        named = None
        if self.name is None:
            head = _HEAD.match(body)
            if head is None:
                return None, ""
            self.name = named = json.loads(head.group(1))
            self._at = head.end()
        if not self._started:  # the whitespace before the value is not part of it
            self._at += len(body[self._at:]) - len(body[self._at:].lstrip())
            self._started = self._at < len(body)
        start = self._at
        while self._at < len(body) and not self.done:
            self._scan(body[self._at])
            self._at += 1
        return named, body[start:self._at]

    def _scan(self, ch: str) -> None:
        if self._in_string:
            if self._escaped:
                self._escaped = False
            elif ch == "\\":
                self._escaped = True
            elif ch == '"':
                self._in_string = False
        elif ch == '"':
            self._in_string = True
        elif ch in "{[":
            self._depth += 1
        elif ch in "}]":
            self._depth -= 1
        self.done = self._depth == 0 and not self._in_string
