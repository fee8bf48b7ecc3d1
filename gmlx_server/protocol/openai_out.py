"""Neutral token events -> OpenAI chat.completion(.chunk) and text_completion bodies (pure)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from gmlx_server.engine.types import TokenEvent
from gmlx_server.errors import EngineFailure, GmlxError, Shed


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


def event_error(ev: TokenEvent) -> GmlxError | None:
    """A final event that ends the request in error: the engine failed, or the governor shed it."""
    if ev.finish_reason == "error":
        return EngineFailure(f"generation failed: {ev.error or 'engine error'}")
    if ev.finish_reason == "shed":
        return Shed()
    return None


class OpenAIEncoder:
    """Turns one request's events into stream chunks, and accumulates the non-streamed body."""

    def __init__(self, meta: ResponseMeta, token_text: Callable[[int], str]) -> None:
        self.meta = meta
        self._token_text = token_text
        self.generated = 0
        self.parts: list[str] = []
        self.logprob_items: list[dict[str, Any]] = []
        self.finish_reason: str | None = None
        self._final_timings: dict[str, Any] = {}

    # --- streaming ----------------------------------------------------------------------------

    def _chunk(self, text: str | None, finish: str | None, lp: list[dict[str, Any]] | None) -> dict[str, Any]:
        m = self.meta
        logprobs = {"content": lp} if lp else None
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": logprobs}
        if m.kind == "chat":
            choice["delta"] = {} if text is None else {"content": text}
        else:
            choice["text"] = text or ""
        obj = "chat.completion.chunk" if m.kind == "chat" else "text_completion"
        chunk: dict[str, Any] = {"id": m.request_id, "object": obj, "created": m.created, "model": m.model,
                                 "choices": [choice]}
        if m.include_usage:
            chunk["usage"] = None  # OpenAI: every chunk but the last carries usage: null
        if m.timings_per_token:
            chunk["timings"] = self.timings()
        return chunk

    def start(self) -> dict[str, Any] | None:
        """Chat streams open with the assistant role, as OpenAI's do."""
        if self.meta.kind != "chat":
            return None
        chunk = self._chunk(None, None, None)
        chunk["choices"][0]["delta"] = {"role": "assistant", "content": ""}
        return chunk

    def feed(self, ev: TokenEvent) -> list[dict[str, Any]]:
        """Account for one event; return the chunks to stream for it (none for empty partial UTF-8)."""
        if ev.token_id is not None:
            self.generated += 1
        lp = self._logprobs(ev)
        if ev.text:
            self.parts.append(ev.text)
        if ev.finish_reason is not None:
            self._finish(ev)
        chunks = []
        if ev.text or lp:
            chunks.append(self._chunk(ev.text, None, lp))
        if ev.finish_reason is not None and self.finish_reason is not None:
            chunks.append(self._chunk(None, self.finish_reason, None))
        return chunks

    def usage_chunk(self) -> dict[str, Any]:
        m = self.meta
        obj = "chat.completion.chunk" if m.kind == "chat" else "text_completion"
        return {"id": m.request_id, "object": obj, "created": m.created, "model": m.model, "choices": [],
                "usage": self.usage()}

    # --- accounting -------------------------------------------------------------------------

    def _finish(self, ev: TokenEvent) -> None:
        # An engine error ends the stream with an error event instead of a finish chunk.
        reasons = {"cancelled": "stop", "error": None}
        self.finish_reason = reasons.get(ev.finish_reason or "", ev.finish_reason)
        t = ev.timings
        if t is not None:
            self.generated = max(self.generated, t.generated)
            self._final_timings = {
                "prompt_ms": round(t.prefill_s * 1000, 3), "prompt_per_second": round(t.prefill_tok_s, 3),
                "predicted_ms": round(t.decode_s * 1000, 3), "predicted_per_second": round(t.decode_tok_s, 3),
            }

    def _logprobs(self, ev: TokenEvent) -> list[dict[str, Any]] | None:
        if not self.meta.logprobs or ev.token_id is None or ev.logprob is None:
            return None
        token = ev.text or self._token_text(ev.token_id)
        top = [self._lp_entry(self._token_text(tid), v) for tid, v in ev.top_logprobs]
        item = {**self._lp_entry(token, ev.logprob), "top_logprobs": top}
        self.logprob_items.append(item)
        return [item]

    @staticmethod
    def _lp_entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    def usage(self) -> dict[str, int]:
        p = self.meta.prompt_tokens
        return {"prompt_tokens": p, "completion_tokens": self.generated, "total_tokens": p + self.generated}

    def timings(self) -> dict[str, Any]:
        """llama.cpp-style timings; predicted_n is the exact cumulative output-token count."""
        return {"prompt_n": self.meta.prompt_tokens, "predicted_n": self.generated, **self._final_timings}

    # --- non-streamed body --------------------------------------------------------------------

    def response(self) -> dict[str, Any]:
        m = self.meta
        text = "".join(self.parts)
        lp = {"content": self.logprob_items} if m.logprobs else None
        if m.kind == "chat":
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "logprobs": lp, "finish_reason": self.finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.finish_reason}
            obj = "text_completion"
        body: dict[str, Any] = {"id": m.request_id, "object": obj, "created": m.created, "model": m.model,
                                "choices": [choice], "usage": self.usage()}
        if m.timings_per_token:
            body["timings"] = self.timings()
        return body
