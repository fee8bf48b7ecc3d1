"""Engine token events (engine.types) -> Anthropic Messages bodies and stream events (pure).

Content is a list of blocks (text, thinking, tool_use). A stream opens with message_start, the
first text block and a ping (Anthropic's own order); later blocks open when their kind changes. A reply
that may think opens no block before its first text, so a thinking block comes first, as Anthropic's do.
"""

from __future__ import annotations

import base64
import copy
import hashlib
from dataclasses import dataclass
from typing import Any

from gmlx_server.engine.types import TokenEvent
from gmlx_server.errors import GmlxError
from gmlx_server.protocol.error_bodies import error_body
from gmlx_server.protocol.shared import Event, Tally, TextFeed, ToolCall, arguments_object, new_id

# The field each block kind accumulates, and the delta type that streams it.
_DELTAS = {"text": ("text", "text_delta"), "thinking": ("thinking", "thinking_delta")}


@dataclass(frozen=True)
class MessageMeta:
    message_id: str
    model: str
    input_tokens: int
    thinking: bool = False  # the reply's thinking block is split out: no text block opens before it


class AnthropicEncoder(TextFeed):
    """Turns one request's events into Anthropic stream events, and accumulates the message body."""

    def __init__(self, meta: MessageMeta) -> None:
        self.meta = meta
        self.tally = Tally()
        self.blocks: list[dict[str, Any]] = []
        self._open: int | None = None  # index of the block a stream has started and not stopped
        self._arguments = ""  # the open tool_use block's JSON so far
        self.reasoning_tokens = 0
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None

    # --- blocks ---------------------------------------------------------------------------------

    def _start_block(self, block: dict[str, Any]) -> list[Event]:
        self.blocks.append(block)
        self._open = len(self.blocks) - 1
        return [("content_block_start", {"type": "content_block_start", "index": self._open,
                                         "content_block": copy.deepcopy(block)})]

    def _stop_block(self) -> list[Event]:
        if self._open is None:
            return []
        events = self._sign() if self.blocks[self._open]["type"] == "thinking" else []
        index, self._open = self._open, None
        return [*events, ("content_block_stop", {"type": "content_block_stop", "index": index})]

    def _sign(self) -> list[Event]:
        """A thinking block ends with its signature, which clients keep and send back with it."""
        block = self.blocks[self._open or 0]
        block["signature"] = signature(block["thinking"])
        return [self._delta({"type": "signature_delta", "signature": block["signature"]})]

    def _delta(self, delta: dict[str, Any]) -> Event:
        return ("content_block_delta", {"type": "content_block_delta", "index": self._open, "delta": delta})

    def _append(self, kind: str, text: str) -> list[Event]:
        if not text:
            return []
        field, delta_type = _DELTAS[kind]
        events: list[Event] = []
        index = self._open
        if index is None or self.blocks[index]["type"] != kind:
            empty = {"type": kind, field: ""} if kind == "text" else {"type": kind, field: "", "signature": ""}
            events = [*self._stop_block(), *self._start_block(empty)]
            index = len(self.blocks) - 1
        self.blocks[index][field] += text
        return [*events, self._delta({"type": delta_type, field: text})]

    def text(self, text: str) -> list[Event]:
        return self._append("text", text)

    def reasoning(self, text: str, tokens: int = 0) -> list[Event]:
        """The model's thinking block, split from its answer: a thinking block."""
        self.reasoning_tokens += tokens
        return self._append("thinking", text)

    def tool_start(self, call_id: str, name: str) -> list[Event]:
        """A parsed call opens: a tool_use block (its id prefixed toolu_, as Anthropic's are)."""
        block = {"type": "tool_use", "id": f"toolu_{call_id}" if call_id else new_id("toolu_"), "name": name,
                 "input": {}}
        self._arguments = ""
        return [*self._stop_block(), *self._start_block(block)]

    def tool_arguments(self, fragment: str) -> list[Event]:
        self._arguments += fragment
        return [self._delta({"type": "input_json_delta", "partial_json": fragment})] if fragment else []

    def tool_end(self, arguments: Any = None) -> list[Event]:
        """The call closes; `arguments` is the parser's object, else the streamed JSON text is parsed."""
        if self._open is not None:
            parsed = arguments if arguments is not None else arguments_object(self._arguments)
            self.blocks[self._open]["input"] = parsed
        return self._stop_block()

    def tool_call(self, call: ToolCall) -> list[Event]:
        """A whole parsed call at once."""
        return [*self.tool_start(call.id, call.name), *self.tool_arguments(call.arguments), *self.tool_end()]

    # --- the message ------------------------------------------------------------------------------

    def usage(self) -> dict[str, int]:
        # Anthropic counts cache reads apart: input_tokens + cache_read_input_tokens is the whole prompt.
        cached = min(self.tally.cached, self.meta.input_tokens)
        return {"input_tokens": self.meta.input_tokens - cached, "output_tokens": self.tally.generated,
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}

    def _message(self, content: list[dict[str, Any]]) -> dict[str, Any]:
        m = self.meta
        return {"id": m.message_id, "type": "message", "role": "assistant", "model": m.model, "content": content,
                "stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence, "usage": self.usage()}

    def start(self) -> list[Event]:
        first = [] if self.meta.thinking else self._start_block({"type": "text", "text": ""})
        return [("message_start", {"type": "message_start", "message": self._message([])}), *first,
                ("ping", {"type": "ping"})]

    def _finish(self, ev: TokenEvent) -> list[Event]:
        calls = [b for b in self.blocks if b["type"] == "tool_use"]
        if calls and not (ev.finish_reason == "length" and not isinstance(calls[-1]["input"], dict)):
            self.stop_reason = "tool_use"  # a call cut short by max_tokens (its input streamed) stays max_tokens
        elif ev.finish_reason == "length":
            self.stop_reason = "max_tokens"
        elif ev.stop_string is not None:
            self.stop_reason, self.stop_sequence = "stop_sequence", ev.stop_string
        else:
            self.stop_reason = "end_turn"  # EOS, or a cancel nobody reads
        delta = {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence}
        events = self._stop_block()
        if not self.blocks:  # a reply that may think, and wrote nothing: still one (empty) text block
            events += [*self._start_block({"type": "text", "text": ""}), *self._stop_block()]
        return [*events,
                ("message_delta", {"type": "message_delta", "delta": delta, "usage": self.usage()}),
                ("message_stop", {"type": "message_stop"})]

    def fail(self, err: GmlxError) -> list[Event]:
        return [("error", error_body(err, anthropic=True))]

    def body(self) -> dict[str, Any]:
        # An empty leading text block only exists because streams open one eagerly.
        content = [b for b in self.blocks if b["type"] != "text" or b["text"]]
        return self._message(content or [{"type": "text", "text": ""}])


def signature(thinking: str) -> str:
    """A thinking block's signature: a digest of its text (no key: nothing here is secret, and a block sent
    back is rendered whatever its signature says)."""
    return base64.b64encode(hashlib.sha256(thinking.encode("utf-8")).digest()).decode("ascii")
