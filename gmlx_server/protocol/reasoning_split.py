"""The reasoning channel: a reply's thinking block split from its answer as it streams, for every protocol.

The block's tags come from the request's ReasoningUse (the template's family, engine/thinking.py). Text that
could be the start of a tag is held back until it cannot; the whitespace the templates put around the block
(`<think>\\n...\\n</think>\\n\\n`) is dropped, so the reasoning sent back in a later turn renders as written.
Reasoning never reaches the tool-call parser: only the answer can hold calls.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal, Protocol

from gmlx_server.engine.thinking import ReasoningUse
from gmlx_server.engine.types import TokenEvent
from gmlx_server.protocol.shared import Event, EventEncoder, Forwarding

State = Literal["start", "inside", "after", "answer"]


class ReasoningSink(Protocol):
    """What a protocol's encoder does with reasoning: its own field, block or item."""

    def reasoning(self, text: str, tokens: int = 0) -> list[Event]: ...


def _partial(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    return next((n for n in range(min(len(tag) - 1, len(text)), 0, -1) if text.endswith(tag[:n])), 0)


class ReasoningSplitter:
    """feed(text) -> (reasoning, answer) pieces of that text; finish() flushes what was held back."""

    def __init__(self, open_tag: str, close_tag: str, starts_inside: bool = False) -> None:
        self.open_tag, self.close_tag = open_tag, close_tag
        self.state: State = "inside" if starts_inside else "start"
        self._buf = ""
        self._held_ws = ""  # reasoning's trailing whitespace: dropped if the block closes after it
        self._fresh = True  # nothing of the block shown yet: its leading whitespace is dropped

    @property
    def inside(self) -> bool:
        return self.state == "inside"

    def feed(self, text: str) -> tuple[str, str]:
        self._buf += text
        reasoning, answer = "", ""
        while True:
            if self.state == "start":
                if not self._step_start():
                    break
            elif self.state == "inside":
                piece, more = self._step_inside()
                reasoning += piece
                if not more:
                    break
            elif self.state == "after":
                self._buf = self._buf.lstrip()
                if not self._buf:
                    break
                self.state = "answer"
            else:
                answer, self._buf = answer + self._buf, ""
                break
        return reasoning, answer

    def finish(self) -> tuple[str, str]:
        """The end of the reply: an unclosed block is all reasoning; a partial tag is plain text."""
        rest, self._buf = self._buf, ""
        if self.state == "inside":  # trailing whitespace of an unclosed block stays dropped
            return (self._held_ws + rest.rstrip() if rest.strip() else ""), ""
        return "", rest if self.state in ("answer", "start") else rest.lstrip()

    def _step_start(self) -> bool:
        """Before the first visible text: a block opens only at the very start of the reply."""
        stripped = self._buf.lstrip()
        if stripped.startswith(self.open_tag):
            self._buf, self.state = stripped[len(self.open_tag):], "inside"
            return True
        if not stripped or self.open_tag.startswith(stripped):
            return False  # whitespace, or the tag's beginning: wait
        self.state = "answer"
        return True

    def _step_inside(self) -> tuple[str, bool]:
        if self._fresh:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return "", False
            self._fresh = False
        at = self._buf.find(self.close_tag)
        if at >= 0:
            piece, self._buf = self._buf[:at].rstrip(), self._buf[at + len(self.close_tag):]
            piece = self._held_ws + piece if piece else ""
            self._held_ws, self.state = "", "after"
            return piece, True
        keep = _partial(self._buf, self.close_tag)
        ready, self._buf = self._buf[:len(self._buf) - keep], self._buf[len(self._buf) - keep:]
        body = ready.rstrip()
        piece = self._held_ws + body if body else ""
        self._held_ws = ready[len(body):] if body else self._held_ws + ready
        return piece, False


class ReasoningEncoder(Forwarding):
    """An EventEncoder that sends the thinking block to `sink` and only the answer on to `inner`."""

    def __init__(self, inner: EventEncoder, sink: ReasoningSink, use: ReasoningUse) -> None:
        self.inner, self.sink, self.use = inner, sink, use
        self.split = ReasoningSplitter(use.syntax.open_tag, use.syntax.close_tag, use.starts_inside)
        self.tokens = 0  # generated tokens spent in the block, its tags included

    def feed(self, ev: TokenEvent) -> list[Event]:
        was_inside = self.split.inside
        reasoning, answer = self.split.feed(ev.text)
        if ev.finish_reason is not None:
            more, rest = self.split.finish()
            reasoning, answer = reasoning + more, answer + rest
        counted = ev.token_id is not None and (was_inside or self.split.inside or bool(reasoning))
        self.tokens += counted
        events = self.sink.reasoning(reasoning, int(counted)) if reasoning or counted else []
        if ev.finish_reason is not None and self.use.report is not None:
            self.use.report(self.tokens)
        return events + self.inner.feed(replace(ev, text=answer))


def with_reasoning(encoder: EventEncoder, sink: ReasoningSink, use: ReasoningUse | None) -> EventEncoder:
    """`encoder` as is, unless the reply's thinking block is split out (`sink` is the protocol's encoder)."""
    return encoder if use is None else ReasoningEncoder(encoder, sink, use)
