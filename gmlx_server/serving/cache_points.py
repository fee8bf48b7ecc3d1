"""Where a request's prompt-cache snapshots go: the anchor and the message-boundary checkpoints.

The engine snapshots KV at these token positions while it prefills (engine/request_run.py): the anchor,
the end of the shared system/tools prefix, is pinned on every model so it outlives LRU eviction;
message boundaries matter on sliding-window models, whose caches cannot be cut back to any prefix.

A position is found by rendering the conversation with one message's content replaced by a marker:
the text before the marker is what every conversation sharing those messages renders first. The
position is the longest common prefix of that text's tokens with the real prompt's ids, so a template
or tokenizer that renders the prefix differently can only make it shorter, never wrong. At most two
renders and two tokenizations; the anchor's tokens are memoized (its text repeats across requests).
Pure Python (no MLX, no falcon).
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypedDict

from gmlx_server.engine.prompt_cache import common_prefix
from gmlx_server.engine.types import ChatTemplate, Engine
from gmlx_server.generation_params import GenerationParams
from gmlx_server.serving.addressing import Settings
from gmlx_server.serving.cache_stats import engine_cache_stats

MARK = "gmlxcachepoint"  # alphanumeric, so trim, tojson and escaping leave it findable
PREFIX_ROLES = frozenset({"system", "developer"})
TURN_ROLES = frozenset({"user", "tool"})
OFF_LOOP_TOKENS = 8192  # above this prompt length, or OFF_LOOP_MESSAGES, the probes run in a thread
OFF_LOOP_MESSAGES = 64  # each probe renders the whole conversation: thousands of short messages add up
_MEMO_SIZE = 32

Message = dict[str, Any]  # as GenerationParams.messages holds them
Render = Callable[[Sequence[Message]], str]
Encode = Callable[[str], list[int]]
ChatRenderer = Callable[[GenerationParams, Settings, ChatTemplate], str]  # serving/generation.py's render_chat


class CacheHints(TypedDict):
    """GenerationRequest's prompt-cache fields, ready to unpack into it."""

    cache_boundaries: tuple[int, ...]
    cache_anchor: int | None


NO_HINTS = CacheHints(cache_boundaries=(), cache_anchor=None)


class TokenMemo:
    """The anchor prefix's tokens per (tokenizer, text): one per model host, shared by its requests.

    A stale entry can only shorten a position: positions are common prefixes with the real ids."""

    def __init__(self, size: int = _MEMO_SIZE) -> None:
        self.size = size
        self._entries: OrderedDict[tuple[int, str], list[int]] = OrderedDict()
        self._lock = threading.Lock()  # probes of long prompts run in threads

    def encode(self, owner: int, text: str, encode: Encode) -> list[int]:
        key = (owner, text)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        ids = encode(text)
        with self._lock:
            self._entries[key] = ids
            if len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return ids


def position(messages: Sequence[Message], probe: int, render: Render, encode: Encode, ids: Sequence[int],
             memo: tuple[TokenMemo, int] | None = None) -> int | None:
    """Tokens of `ids` that precede message `probe`'s content; None when the template hides the marker."""
    probed = [*messages[:probe], {**messages[probe], "content": MARK}] if probe < len(messages) else [
        *messages, {"role": "user", "content": MARK}]
    try:
        text = render(probed)
    except Exception:  # a template that refuses the cut conversation: no position, the request goes on
        return None
    cut = text.find(MARK)
    if cut <= 0:
        return None
    head = memo[0].encode(memo[1], text[:cut], encode) if memo is not None else encode(text[:cut])
    n = common_prefix(head, ids)
    return n if 0 < n < len(ids) else None


def cache_hints(messages: Sequence[Message], render: Render, encode: Encode, ids: Sequence[int], *,
                shared_prefix: bool, window: int | None, memo: tuple[TokenMemo, int] | None = None) -> CacheHints:
    """The anchor (only when there is a system/tools prefix to share) and, for a sliding-window model
    whose prompt outgrows its window, the end of the conversation before the newest user/tool turn."""
    first = next((i for i, m in enumerate(messages) if m.get("role") not in PREFIX_ROLES), len(messages))
    anchor = position(messages, first, render, encode, ids, memo) if shared_prefix else None
    boundaries: set[int] = set()
    if window is not None and len(ids) > window:  # shorter prompts stay trimmable: the block tier covers them
        newest = _newest_turn(messages)
        if newest is not None and newest > first:
            at = position(messages, newest, render, encode, ids)
            boundaries.update({at} if at is not None else set())
    if anchor is not None:
        boundaries.add(anchor)
    return CacheHints(cache_boundaries=tuple(sorted(boundaries)), cache_anchor=anchor)


def _newest_turn(messages: Sequence[Message]) -> int | None:
    """The first message of the trailing run of user/tool messages (None when the last is the model's)."""
    i = len(messages)
    while i > 0 and messages[i - 1].get("role") in TURN_ROLES:
        i -= 1
    return i if i < len(messages) else None


async def request_hints(inp: GenerationParams, settings: Settings, engine: Engine, ids: Sequence[int],
                        render_chat: ChatRenderer, memo: TokenMemo | None = None) -> CacheHints:
    """generation.py's entry: probes rendered through the request's own path (profile system prompt,
    tools, template variables), so they agree with the prompt it rendered."""
    if inp.prompt is not None or not engine_cache_stats(engine).get("enabled"):  # no messages, or no cache
        return NO_HINTS

    def hints() -> CacheHints:
        def render(messages: Sequence[Message]) -> str:
            return render_chat(replace(inp, messages=tuple(messages)), settings, engine.template)

        def encode(text: str) -> list[int]:
            return engine.tokenizer.encode(text, False)

        shared = bool(settings.system or inp.offers_tools
                      or any(m.get("role") in PREFIX_ROLES for m in inp.messages))
        return cache_hints(inp.messages, render, encode, ids, shared_prefix=shared,
                           window=engine.info.sliding_window,
                           memo=(memo, id(engine.tokenizer)) if memo is not None else None)

    heavy = len(ids) > OFF_LOOP_TOKENS or len(inp.messages) > OFF_LOOP_MESSAGES
    return await asyncio.to_thread(hints) if heavy else hints()
