"""Engine token events (engine.types) -> OpenAI Responses objects and stream events (pure).

Output items: a message item (one output_text part) opened at the first text, function_call
items for parsed tool calls. Every stream event carries a sequence_number; a stream ends with
response.completed, response.incomplete (the output cap was hit) or error + response.failed.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gmlx_server.engine.types import TokenEvent
from gmlx_server.errors import GmlxError
from gmlx_server.protocol.shared import Event, Tally, TextFeed, ToolCall, new_id, tool_call_entry


@dataclass(frozen=True)
class ResponsesMeta:
    response_id: str
    model: str
    created_at: int
    input_tokens: int
    echo: Mapping[str, Any] = field(default_factory=dict)  # request fields the object repeats


class ResponsesEncoder(TextFeed):
    """Turns one request's events into Responses stream events, and accumulates the response object."""

    def __init__(self, meta: ResponsesMeta) -> None:
        self.meta = meta
        self.tally = Tally()
        self.items: list[dict[str, Any]] = []
        self._message: int | None = None  # index of the message item still open
        self._thought: int | None = None  # index of the reasoning item still open
        self.reasoning_tokens = 0
        self._seq = 0
        self.status = "in_progress"
        self.incomplete: dict[str, str] | None = None
        self.error: dict[str, Any] | None = None

    def _event(self, kind: str, **fields: Any) -> Event:
        payload = {"type": kind, **copy.deepcopy(fields), "sequence_number": self._seq}
        self._seq += 1
        return kind, payload

    # --- the message item -------------------------------------------------------------------------

    def _open_message(self) -> list[Event]:
        item: dict[str, Any] = {"id": new_id("msg_"), "type": "message", "status": "in_progress",
                                "role": "assistant", "content": []}
        self._message = len(self.items)
        return self._open_part(item, {"type": "output_text", "text": "", "annotations": [], "logprobs": []})

    def _open_part(self, item: dict[str, Any], part: dict[str, Any]) -> list[Event]:
        """A new item with one (empty) text part: the item's added event, then the part's."""
        self.items.append(item)
        index = len(self.items) - 1
        events = [self._event("response.output_item.added", output_index=index, item=item)]
        item["content"].append(part)
        return [*events, self._event("response.content_part.added", item_id=item["id"], output_index=index,
                                     content_index=0, part=part)]

    def _close_message(self) -> list[Event]:
        if self._message is None:
            return []
        index, self._message = self._message, None
        return self._close_part(index, "response.output_text.done", logprobs=[])

    def _close_part(self, index: int, done: str, **more: Any) -> list[Event]:
        """An item of one text part is complete: its text's done event, the part's, the item's."""
        item = self.items[index]
        part = item["content"][0]
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        item["status"] = "completed"
        return [self._event(done, **where, text=part["text"], **more),
                self._event("response.content_part.done", **where, part=part),
                self._event("response.output_item.done", output_index=index, item=item)]

    def text(self, text: str) -> list[Event]:
        if not text:
            return []
        events = self._close_thought()
        events += self._open_message() if self._message is None else []
        index = len(self.items) - 1  # an open message item is always the last one
        item = self.items[index]
        item["content"][0]["text"] += text
        return [*events, self._event("response.output_text.delta", item_id=item["id"], output_index=index,
                                     content_index=0, delta=text, logprobs=[])]

    # --- the reasoning item -----------------------------------------------------------------------

    def reasoning(self, text: str, tokens: int = 0) -> list[Event]:
        """The thinking block: a reasoning item whose one reasoning_text part grows by deltas."""
        self.reasoning_tokens += tokens
        if not text:
            return []
        events: list[Event] = []
        if self._thought is None:
            item: dict[str, Any] = {"id": new_id("rs_"), "type": "reasoning", "status": "in_progress", "summary": [],
                                    "content": []}
            self._thought = len(self.items)
            events = self._open_part(item, {"type": "reasoning_text", "text": ""})
        index = self._thought
        item = self.items[index]
        item["content"][0]["text"] += text
        return [*events, self._event("response.reasoning_text.delta", item_id=item["id"], output_index=index,
                                     content_index=0, delta=text)]

    def _close_thought(self) -> list[Event]:
        if self._thought is None:
            return []
        index, self._thought = self._thought, None
        return self._close_part(index, "response.reasoning_text.done")

    def tool_start(self, call_id: str, name: str) -> list[Event]:
        """A parsed call opens: a function_call item (call_id prefixed call_, as OpenAI's are)."""
        item = {"id": new_id("fc_"), "type": "function_call", "status": "in_progress",
                "call_id": f"call_{call_id}" if call_id else new_id("call_"), "name": name, "arguments": ""}
        events = [*self._close_thought(), *self._close_message()]
        self.items.append(item)
        return [*events, self._event("response.output_item.added", output_index=len(self.items) - 1, item=item)]

    def _call_item(self) -> tuple[int, dict[str, Any]]:
        return len(self.items) - 1, self.items[-1]  # an open call is always the last item

    def tool_arguments(self, fragment: str) -> list[Event]:
        index, item = self._call_item()
        item["arguments"] += fragment
        return [self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                            delta=fragment)] if fragment else []

    def tool_end(self, arguments: Any = None) -> list[Event]:
        """The call closes; without streamed fragments, `arguments` (the parser's object) is the JSON."""
        index, item = self._call_item()
        if not item["arguments"] and arguments is not None:
            item["arguments"] = json.dumps(arguments, ensure_ascii=False)
        item["status"] = "completed"
        return [self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                            arguments=item["arguments"]),
                self._event("response.output_item.done", output_index=index, item=item)]

    def tool_call(self, call: ToolCall) -> list[Event]:
        """A whole parsed call at once."""
        return [*self.tool_start(call.id, call.name), *self.tool_arguments(call.arguments), *self.tool_end()]

    # --- the response -----------------------------------------------------------------------------

    def usage(self) -> dict[str, Any]:
        i, o = self.meta.input_tokens, self.tally.generated
        return {"input_tokens": i, "input_tokens_details": {"cached_tokens": self.tally.cached}, "output_tokens": o,
                "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens}, "total_tokens": i + o}

    def response(self) -> dict[str, Any]:
        m = self.meta
        done = self.status != "in_progress"
        return {"id": m.response_id, "object": "response", "created_at": m.created_at, "status": self.status,
                "error": self.error, "incomplete_details": self.incomplete, "model": m.model,
                "output": copy.deepcopy(self.items), "parallel_tool_calls": True,
                "reasoning": {"effort": None, "summary": None}, "text": {"format": {"type": "text"}},
                "truncation": "disabled", "user": None, **m.echo, "usage": self.usage() if done else None}

    def start(self) -> list[Event]:
        return [self._event("response.created", response=self.response()),
                self._event("response.in_progress", response=self.response())]

    def _finish(self, ev: TokenEvent) -> list[Event]:
        events = [*self._close_thought(), *self._close_message()]
        if not self.items:  # nothing generated: still answer with one (empty) message
            events += [*self._open_message(), *self._close_message()]
        if ev.finish_reason == "length":
            self.status, self.incomplete = "incomplete", {"reason": "max_output_tokens"}
        else:
            self.status = "completed"
        return [*events, self._event(f"response.{self.status}", response=self.response())]

    def fail(self, err: GmlxError) -> list[Event]:
        self.status, self.error = "failed", {"code": err.code or err.type, "message": err.message}
        return [self._event("error", code=err.code or err.type, message=err.message, param=err.param),
                self._event("response.failed", response=self.response())]

    def body(self) -> dict[str, Any]:
        return self.response()

    def output_messages(self) -> list[dict[str, Any]]:
        """the assistant turn in chat-template form, for the conversation store."""
        texts = [p["text"] for it in self.items if it["type"] == "message" for p in it["content"]]
        calls = [tool_call_entry(it["call_id"], it["name"], it["arguments"], "output")
                 for it in self.items if it["type"] == "function_call"]
        thought = "".join(p["text"] for it in self.items if it["type"] == "reasoning" for p in it["content"])
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
        if thought:
            msg["reasoning_content"] = thought
        return [{**msg, "tool_calls": calls} if calls else msg]
