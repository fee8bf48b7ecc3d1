"""A scripted fake engine behind the real Engine protocol, for fast route and service tests.

Tokens are characters (id = code point). The engine "generates" a scripted list of text
pieces, one per token, with a configurable prefill and per-token delay, and honors
max_tokens, stop strings (held back until they cannot be a stop), cancel() and failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gmlx_server.config import ModelEntry, RuntimeEnv
from gmlx_server.engine.base import EngineBase
from gmlx_server.engine.types import (
    ChatTemplate,
    EngineStats,
    FinishReason,
    GenerationRequest,
    ModelInfo,
    SpeculativeStats,
    Timings,
    TokenEvent,
    Tokenizer,
)
from gmlx_server.serving.cache_points import MARK


class FakeTokenizer:
    vocab_size = 0x110000
    bos_id: int | None = 1
    eos_ids = frozenset({2})
    add_bos = True
    special_ids: frozenset[int] = frozenset()
    strip_leading_space = False
    max_token_chars: int | None = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [ord(c) for c in text]
        return [self.bos_id, *ids] if add_special_tokens and self.add_bos and self.bos_id is not None else ids

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i) for i in ids if i > 2)

    def token_bytes(self, token_id: int) -> bytes:
        return chr(token_id).encode() if token_id > 2 else b""


class FakeTemplate:
    """`<|role|>content` lines; records what it was asked to render. `text` is the "Jinja source"
    the tool-call syntax is inferred from (HERMES_TEXT: Hermes <tool_call> calls)."""

    source = "fake"

    def __init__(self, variables: frozenset[str] = frozenset({"enable_thinking", "reasoning_effort"}),
                 text: str = "") -> None:
        self.variables = variables
        self.text = text
        self.calls: list[dict[str, object]] = []

    def render(self, messages: Sequence[Mapping[str, object]],
               tools: Sequence[Mapping[str, object]] | None = None,
               add_generation_prompt: bool = True, **variables: object) -> str:
        if not any(m.get("content") == MARK for m in messages):  # prompt-cache probes are not the prompt
            self.calls.append({"messages": list(messages), "tools": tools, "variables": variables})
        text = "".join(f"<|{m['role']}|>{m.get('content') or ''}\n" for m in messages)
        if tools:
            text = f"<|tools|>{len(tools)}\n" + text
        if add_generation_prompt:
            text += "<|assistant|>"
            if variables.get("enable_thinking"):
                text += "<think>"
        return text


HERMES_TEXT = "{{ tools }} answer with <tool_call>{...}</tool_call>"

Script = Callable[[GenerationRequest], Sequence[str]]


@dataclass
class FakeBehavior:
    """What the engine does; tests mutate it between requests."""

    pieces: Sequence[str] = ("Hello", ",", " world", "!")
    script: Script | None = None  # overrides `pieces` per request
    prefill_s: float = 0.0
    token_s: float = 0.0
    fail_after: int | None = None  # end with finish_reason "error" after this many tokens
    shed_after: int | None = None  # end with finish_reason "shed" after this many tokens
    submit_error: Exception | None = None  # raised by submit() itself (e.g. a queue-full error)
    speculative: SpeculativeStats | None = None  # a drafting engine's per-request counts, in the final timings


class FakeHandle:
    def __init__(self, engine: FakeEngine, request: GenerationRequest) -> None:
        self.engine, self.request = engine, request
        self.request_id = request.request_id
        self.cancelled = False
        self.finished: FinishReason | None = None
        self._wake = asyncio.Event()

    def cancel(self) -> None:
        self.cancelled = True
        self._wake.set()

    async def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), seconds)

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self._run()

    async def _run(self) -> AsyncIterator[TokenEvent]:
        self.engine.running.add(self)
        try:
            async for ev in self._events():
                if ev.finish_reason is not None:  # like the real engine: out of stats before the final event
                    self.engine.running.discard(self)
                yield ev
        finally:
            self.engine.running.discard(self)

    def _final(self, reason: FinishReason, generated: int, t0: float, stop: str | None = None,
               error: str | None = None) -> TokenEvent:
        self.finished = reason
        n = len(self.request.prompt_tokens)
        b = self.engine.behavior
        spans = ((0, n, b.prefill_s),) if b.prefill_s > 0 and n else ()  # its sleep stands for computed tokens
        timings = Timings(n, generated, b.prefill_s, time.monotonic() - t0, None, speculative=b.speculative,
                          spans=spans)
        return TokenEvent("", None, finish_reason=reason, stop_string=stop, error=error, timings=timings)

    async def _events(self) -> AsyncIterator[TokenEvent]:
        b, req, t0 = self.engine.behavior, self.request, time.monotonic()
        pieces = list(b.script(req) if b.script else b.pieces)
        await self._sleep(b.prefill_s)
        pending, generated = "", 0
        for piece in pieces:
            if self.cancelled:
                yield self._final("cancelled", generated, t0)
                return
            if generated == b.fail_after or generated == b.shed_after:
                reason: FinishReason = "error" if generated == b.fail_after else "shed"
                yield self._final(reason, generated, t0, error="boom")
                return
            if generated >= req.max_tokens:
                if pending:
                    yield TokenEvent(pending, None)
                yield self._final("length", generated, t0)
                return
            generated += 1
            pending += piece
            hit = next((s for s in req.stop if s in pending), None)
            if hit is not None:
                yield TokenEvent(pending[: pending.index(hit)], ord(piece[0]) if piece else 0)
                yield self._final("stop", generated, t0, stop=hit)
                return
            keep = _held_back(pending, req.stop)
            out, pending = pending[: len(pending) - keep], pending[len(pending) - keep:]
            yield TokenEvent(out, ord(piece[0]) if piece else 0, logprob=-0.5 if req.logprobs else None,
                             top_logprobs=tuple((65 + i, -1.0 - i) for i in range(req.top_logprobs)))
            await self._sleep(b.token_s)
        if pending:
            yield TokenEvent(pending, None)
        yield self._final("length" if generated >= req.max_tokens else "stop", generated, t0)


def _held_back(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that could still grow into a stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best


@dataclass
class FakeEngine(EngineBase):
    info: ModelInfo
    behavior: FakeBehavior = field(default_factory=FakeBehavior)
    # Typed as the protocols: Engine's attributes are invariant. Tests reach FakeTemplate.calls via Any.
    tokenizer: Tokenizer = field(default_factory=FakeTokenizer)
    template: ChatTemplate = field(default_factory=FakeTemplate)
    decode_batch: int = 4
    waiting: int = 0  # what stats() reports as queued (tests set it)
    closed: bool = False
    fault: str | None = None  # set by tests: the engine "died" for this reason
    submitted: list[GenerationRequest] = field(default_factory=list)
    handles: list[FakeHandle] = field(default_factory=list)
    running: set[FakeHandle] = field(default_factory=set)

    def submit(self, request: GenerationRequest) -> FakeHandle:
        if self.behavior.submit_error is not None:
            raise self.behavior.submit_error
        self.submitted.append(request)
        handle = FakeHandle(self, request)
        self.handles.append(handle)
        return handle

    def stats(self) -> EngineStats:
        return EngineStats(self.decode_batch, len(self.running), self.waiting)

    def close(self) -> None:
        self.closed = True


def fake_info(model_id: str, family: str = "llama", context_length: int = 4096) -> ModelInfo:
    return ModelInfo(model_id=model_id, path=f"/fake/{model_id}.gguf", architecture=family, family=family,
                     context_length=context_length, trained_context_length=context_length, n_layers=2,
                     n_kv_heads=1, head_dim=8, sliding_window=None, weights_layout="packed", weights_bytes=1,
                     load_s=0.0)


@dataclass
class FakeFactory:
    """An engine_factory that builds FakeEngines and remembers them by model id."""

    behavior: FakeBehavior = field(default_factory=FakeBehavior)
    family: str = "llama"
    context_length: int = 4096
    template_text: str = ""  # e.g. HERMES_TEXT: the engines' templates define a tool-call syntax
    drafts: bool = False  # the engines claim a speculative drafter
    engines: dict[str, FakeEngine] = field(default_factory=dict)
    calls: int = 0

    def __call__(self, entry: ModelEntry, env: RuntimeEnv) -> FakeEngine:
        self.calls += 1
        ctx = min(self.context_length, entry.max_kv_size or self.context_length)
        info = replace(fake_info(entry.id, self.family, ctx), drafts=self.drafts)
        engine = FakeEngine(info, self.behavior, template=FakeTemplate(text=self.template_text))
        self.engines[entry.id] = engine
        return engine
