"""The request log: one INFO line per finished generation request (logger `gmlx.request`), key=value and
greppable, never the prompt's text unless the logger is at DEBUG:

    request id=chatcmpl-… route=/v1/chat/completions model=smollm2 profile=- status=200 prompt_tokens=412
    cached_tokens=384 generated_tokens=32 ttft_s=0.311 duration_s=2.904 decode_tok_s=12.4 finish=stop

plus `cache=TIER restore_s=S` when cached tokens were restored (TIER a RAM tier or disk),
`clamp=32000->7780` when the clamp lowered max_tokens, `shed=1` when the governor shed the request,
`tool_calls=N tool_parser=NAME` when the reply was parsed for calls (finish=tool_calls when it held any),
`reasoning_tokens=N` when its thinking block was read apart from the answer, `ignored=a,b` naming the body's
ignored fields, and on a refusal `error=TYPE code=CODE` with the counts the refusal knows (max_tokens,
context_budget, ...). A request whose client left is written when the engine's cancelled event arrives,
with its tokens and TTFT. The same fields ride along as structured data, which the JSON log format
(gmlx_server/log_format.py) writes as keys.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gmlx_server.engine.types import TokenEvent
from gmlx_server.errors import GmlxError
from gmlx_server.log_format import FIELDS, kv_text

if TYPE_CHECKING:
    from gmlx_server.serving.fair_share import Caller

log = logging.getLogger("gmlx.request")


@dataclass(frozen=True)
class OutputCap:
    """A request's output cap: what it was granted, and what the client asked when the clamp lowered it."""

    max_tokens: int
    requested: int | None = None  # the client's max_tokens when the clamp lowered it


@dataclass
class RequestRecord:
    """What one request became, filled in as it goes: the route, then the service, then its final event."""

    route: str
    t0: float = field(default_factory=time.perf_counter)
    request_id: str | None = None
    model: str | None = None
    profile: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    cache_tier: str | None = None  # the prompt-cache tier the cached tokens came from (a RAM tier or disk)
    restore_s: float | None = None  # the seconds they took to come back
    generated_tokens: int | None = None
    ttft_s: float | None = None
    decode_tok_s: float | None = None
    finish: str | None = None
    clamp: tuple[int, int] | None = None  # (requested, granted) when the clamp lowered max_tokens
    tool_calls: int | None = None
    tool_parser: str | None = None  # the syntax the reply was parsed in (json under tool_format json)
    reasoning_tokens: int | None = None  # of generated_tokens, when the reply's thinking block was read apart
    error: GmlxError | None = None  # what the request was refused with
    ignored: tuple[str, ...] = ()  # the body's fields gmlx ignored (protocol/params.py ignored_fields)
    prompt: str | None = None  # only while the logger is at DEBUG
    caller: Caller | None = None  # who sent it (the auth middleware sets it): its key's name is logged
    live: bool = False  # submitted to an engine: its final event will come, and the line waits for it
    _status: int | None = None  # the response's status, once the response is complete

    def started(self, model: str, profile: str | None, prompt_tokens: int, cap: OutputCap, prompt: str) -> None:
        self.model, self.profile, self.prompt_tokens = model, profile, prompt_tokens
        if cap.requested is not None:
            self.clamp = (cap.requested, cap.max_tokens)
        if log.isEnabledFor(logging.DEBUG):
            self.prompt = prompt

    def submitted(self) -> None:
        self.live = True

    def finished(self, ev: TokenEvent) -> None:
        """The engine's final event: how it ended and its timings (and the line, if the response is done)."""
        self.finish = ev.finish_reason
        t = ev.timings
        if t is not None:
            self.prompt_tokens, self.cached_tokens = t.prompt_tokens, t.cached_tokens
            if t.cached_tokens:
                self.cache_tier, self.restore_s = t.cache_tier, t.restore_s
            self.generated_tokens, self.ttft_s = t.generated, t.ttft_s
            self.decode_tok_s = t.decode_tok_s if t.generated > 1 else None
        if self._status is not None:
            self._write(self._status)

    def refused(self, err: GmlxError) -> None:
        self.error = err
        counted = err.extra.get("prompt_tokens")
        if self.prompt_tokens is None and isinstance(counted, int):
            self.prompt_tokens = counted

    def fields(self, status: int) -> dict[str, Any]:
        """The line's fields, in order; None stays null (`-` in text)."""
        out: dict[str, Any] = {
            "id": self.request_id, "route": self.route, "model": self.model, "profile": self.profile,
            "status": status, "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
            "generated_tokens": self.generated_tokens, "ttft_s": _round(self.ttft_s),
            "duration_s": _round(time.perf_counter() - self.t0), "decode_tok_s": _round(self.decode_tok_s, 1),
            "finish": "tool_calls" if self.tool_calls and self.finish == "stop" else self.finish,
        }
        extra = {"cache": self.cache_tier, "restore_s": _round(self.restore_s),
                 "clamp": f"{self.clamp[0]}->{self.clamp[1]}" if self.clamp else None,
                 "shed": 1 if self.finish == "shed" else None, "tool_calls": self.tool_calls,
                 "tool_parser": self.tool_parser, "reasoning_tokens": self.reasoning_tokens,
                 "ignored": ",".join(self.ignored) or None, **self._refusal(),
                 "prompt": self.prompt, "key": self.caller.key if self.caller is not None else None}
        return out | {k: v for k, v in extra.items() if v is not None}

    def _refusal(self) -> dict[str, Any]:
        """error=TYPE, code=CODE where it says more, and the refusal's own counts (ints only, never text)."""
        err = self.error
        if err is None:
            return {}
        counts = {k: v for k, v in err.extra.items() if isinstance(v, int) and not isinstance(v, bool)
                  and k != "prompt_tokens"}
        return {"error": err.type, "code": err.code if err.code != err.type else None, **counts}

    def emit(self, status: int) -> None:
        """The response is complete: write the line now, or when the engine's final event arrives."""
        self._status = status
        if not self.live or self.finish is not None:
            self._write(status)

    def _write(self, status: int) -> None:
        fields = self.fields(status)
        log.info("request %s", kv_text(fields), extra={FIELDS: fields})


def _round(value: float | None, digits: int = 3) -> float | None:
    return round(value, digits) if value is not None else None
