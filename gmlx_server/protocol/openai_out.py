"""Engine token events (engine.types) -> OpenAI chat.completion(.chunk) and text_completion bodies (pure).

An EventEncoder like the Anthropic and Responses ones, so one driver streams all three: OpenAI's
events are unnamed `data:` lines, and a stream ends with the raw text [DONE].
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from typing import Any, Literal

from gmlx_server.engine.types import TokenEvent, Tokenizer
from gmlx_server.errors import EngineFailure, GmlxError, Shed
from gmlx_server.protocol.error_bodies import error_body
from gmlx_server.protocol.shared import Event, Tally, new_id

DONE: Event = ("", "[DONE]")
_NO_LOGPROB = -9999.0  # what OpenAI reports for a token that cannot occur (JSON has no -Infinity)


@dataclass(frozen=True)
class ResponseMeta:
    request_id: str
    model: str
    created: int
    prompt_tokens: int
    kind: Literal["chat", "completion"] = "chat"
    include_usage: bool = False
    timings_per_token: bool = False
    logprobs: bool = False


def _whole(call: dict[str, Any]) -> bool:
    try:
        json.loads(call["function"]["arguments"])
    except ValueError:
        return False
    return True


def event_error(ev: TokenEvent) -> GmlxError | None:
    """A final event that ends the request in error: the engine failed, or the governor shed it."""
    if ev.finish_reason == "error":
        return EngineFailure(f"generation failed: {ev.error or 'engine error'}")
    if ev.finish_reason == "shed":
        return Shed(ev.error) if ev.error else Shed()  # the governor's or the shutdown's own reason
    return None


class OpenAIEncoder:
    """Turns one request's events into stream chunks, and accumulates the non-streamed body."""

    def __init__(self, meta: ResponseMeta, tokenizer: Tokenizer) -> None:
        self.meta = meta
        self._tokenizer = tokenizer
        self.tally = Tally()
        self.parts: list[str] = []
        self.reasoning_parts: list[str] = []
        self.reasoning_tokens = 0
        self.tool_calls: list[dict[str, Any]] = []
        self.logprob_items: list[dict[str, Any]] = []
        self.finish_reason: str | None = None
        self._final_timings: dict[str, Any] = {}

    @property
    def _object(self) -> str:
        return "chat.completion.chunk" if self.meta.kind == "chat" else "text_completion"

    def _chunk(self, delta: dict[str, Any], finish: str | None = None,
               lp: list[dict[str, Any]] | None = None) -> Event:
        m = self.meta
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": {"content": lp} if lp else None}
        if m.kind == "chat":
            choice["delta"] = delta
        else:
            choice["text"] = delta.get("content") or ""
        chunk: dict[str, Any] = {"id": m.request_id, "object": self._object, "created": m.created, "model": m.model,
                                 "choices": [choice]}
        if m.include_usage:
            chunk["usage"] = None  # OpenAI: every chunk but the last carries usage: null
        if m.timings_per_token:
            chunk["timings"] = self.timings()
        return "", chunk

    # --- EventEncoder ---------------------------------------------------------------------------

    def start(self) -> list[Event]:
        """Chat streams open with the assistant role, as OpenAI's do."""
        return [self._chunk({"role": "assistant", "content": ""})] if self.meta.kind == "chat" else []

    def feed(self, ev: TokenEvent) -> list[Event]:
        """Account for one event; the chunks to stream for it (none for empty partial UTF-8)."""
        self.tally.count(ev)
        events = self.text(ev.text, self._logprobs(ev))
        if ev.finish_reason is not None:
            events += self._finish(ev)
        return events

    def text(self, text: str, lp: list[dict[str, Any]] | None = None) -> list[Event]:
        if not (text or lp):
            return []
        self.parts.append(text)
        return [self._chunk({"content": text}, lp=lp)]

    def reasoning(self, text: str, tokens: int = 0) -> list[Event]:
        """The thinking block: `reasoning_content` (DeepSeek's and llama-server's name) and `reasoning` (vLLM's)."""
        self.reasoning_tokens += tokens
        if not text:
            return []
        self.reasoning_parts.append(text)
        return [self._chunk({"reasoning_content": text, "reasoning": text})]

    def tool_start(self, call_id: str, name: str) -> list[Event]:
        """A parsed call opens: a tool_calls delta with its id (prefixed call_, as OpenAI's are) and name."""
        call = {"id": f"call_{call_id}" if call_id else new_id("call_"), "type": "function",
                "function": {"name": name, "arguments": ""}}
        self.tool_calls.append(call)
        return [self._chunk({"tool_calls": [{"index": len(self.tool_calls) - 1, **copy.deepcopy(call)}]})]

    def tool_arguments(self, fragment: str) -> list[Event]:
        if not fragment:
            return []
        self.tool_calls[-1]["function"]["arguments"] += fragment
        index = len(self.tool_calls) - 1
        return [self._chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})]

    def tool_end(self, arguments: Any = None) -> list[Event]:
        fn = self.tool_calls[-1]["function"]
        if not fn["arguments"] and arguments is not None:
            fn["arguments"] = json.dumps(arguments, ensure_ascii=False)
        return []

    def fail(self, err: GmlxError) -> list[Event]:
        return [("", error_body(err)), DONE]

    def body(self) -> dict[str, Any]:
        return self.response()

    # --- accounting -----------------------------------------------------------------------------

    def _finish(self, ev: TokenEvent) -> list[Event]:
        # An engine error ends the stream with fail()'s error event instead of a finish chunk.
        reason = {"cancelled": "stop", "error": None}.get(ev.finish_reason or "", ev.finish_reason)
        if self.tool_calls and (reason == "stop" or (reason == "length" and _whole(self.tool_calls[-1]))):
            reason = "tool_calls"  # a call cut short by max_tokens (its arguments streamed) stays `length`
        self.finish_reason = reason
        t = ev.timings
        if t is not None:
            self._final_timings = {
                "prompt_ms": round(t.prefill_s * 1000, 3), "prompt_per_second": round(t.prefill_tok_s, 3),
                "predicted_ms": round(t.decode_s * 1000, 3), "predicted_per_second": round(t.decode_tok_s, 3),
            }
        events = [self._chunk({}, reason)] if reason is not None else []
        if not Tally.ends_well(ev):
            return events
        return [*events, *([self.usage_chunk()] if self.meta.include_usage else []), DONE]

    def usage_chunk(self) -> Event:
        m = self.meta
        return "", {"id": m.request_id, "object": self._object, "created": m.created, "model": m.model,
                    "choices": [], "usage": self.usage()}

    def _logprobs(self, ev: TokenEvent) -> list[dict[str, Any]] | None:
        if not self.meta.logprobs or ev.token_id is None or ev.logprob is None:
            return None
        top = [self._lp_entry(tid, v) for tid, v in ev.top_logprobs]
        item = {**self._lp_entry(ev.token_id, ev.logprob), "top_logprobs": top}
        self.logprob_items.append(item)
        return [item]

    def _lp_entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        """The token's own text and bytes (a character split across tokens shows in `bytes` only)."""
        raw = self._tokenizer.token_bytes(token_id)
        value = logprob if math.isfinite(logprob) else _NO_LOGPROB
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": value, "bytes": list(raw)}

    def usage(self) -> dict[str, Any]:
        p, n = self.meta.prompt_tokens, self.tally.generated
        return {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n,
                "prompt_tokens_details": {"cached_tokens": self.tally.cached},
                "completion_tokens_details": {"reasoning_tokens": self.reasoning_tokens}}

    def timings(self) -> dict[str, Any]:
        """llama.cpp-style timings; predicted_n is the exact cumulative output-token count."""
        return {"prompt_n": self.meta.prompt_tokens, "predicted_n": self.tally.generated, **self._final_timings}

    # --- non-streamed body ----------------------------------------------------------------------

    def response(self) -> dict[str, Any]:
        m = self.meta
        text = "".join(self.parts)
        if m.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if self.reasoning_parts:
                thought = "".join(self.reasoning_parts)
                message = {**message, "reasoning_content": thought, "reasoning": thought}
            if self.tool_calls:  # OpenAI: content is null when the reply is only calls
                message = {**message, "content": text or None, "tool_calls": copy.deepcopy(self.tool_calls)}
            lp = {"content": self.logprob_items} if m.logprobs else None
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": lp,
                                      "finish_reason": self.finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.finish_reason}
            obj = "text_completion"
        body: dict[str, Any] = {"id": m.request_id, "object": obj, "created": m.created, "model": m.model,
                                "choices": [choice], "usage": self.usage()}
        if m.timings_per_token:
            body["timings"] = self.timings()
        return body
