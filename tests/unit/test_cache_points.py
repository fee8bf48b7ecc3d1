"""Prompt-cache snapshot points: the anchor and message boundaries, on a fake template and on the real ones."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gmlx_plan.gguf_header import read_header
from gmlx_server.engine.arch import arch_spec
from gmlx_server.engine.chat_template import JinjaChatTemplate
from gmlx_server.engine.tokenizer import GGUFTokenizer
from gmlx_server.engine.types import PromptCacheStats
from gmlx_server.generation_params import GenerationParams
from gmlx_server.serving.addressing import Settings
from gmlx_server.serving.cache_points import NO_HINTS, cache_hints, common_prefix, request_hints
from gmlx_server.serving.generation import render_chat
from tests.conftest import gemma_path, smollm2_path
from tests.fakes import FakeTemplate, FakeTokenizer, fake_info

Msgs = list[dict[str, Any]]
CHAT: Msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
              {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]


def _fake(messages: Msgs, window: int | None = None, shared: bool = True) -> tuple[list[int], dict[str, Any]]:
    tpl, tok = FakeTemplate(), FakeTokenizer()
    ids = tok.encode(tpl.render(messages), False)
    hints = cache_hints(messages, tpl.render, lambda t: tok.encode(t, False), ids, shared_prefix=shared,
                        window=window)
    return ids, dict(hints)


def test_anchor_ends_before_the_first_turn_and_boundaries_wait_for_a_window() -> None:
    ids, hints = _fake(CHAT)
    assert hints == {"cache_anchor": len("<|system|>Be brief.\n<|user|>"), "cache_boundaries": (hints["cache_anchor"],)}
    _, windowed = _fake(CHAT, window=8)
    newest = len("<|system|>Be brief.\n<|user|>Hi\n<|assistant|>Hello\n<|user|>")
    assert windowed["cache_boundaries"] == (windowed["cache_anchor"], newest)
    assert _fake(CHAT, window=len(ids))[1]["cache_boundaries"] == (hints["cache_anchor"],)  # fits the window


def test_a_trailing_run_of_tool_results_is_one_turn() -> None:
    msgs = [*CHAT[:3], {"role": "assistant", "content": "call"}, {"role": "tool", "content": "r1"},
            {"role": "tool", "content": "r2"}]
    _, hints = _fake(msgs, window=1)
    assert hints["cache_boundaries"][-1] == len("<|system|>Be brief.\n<|user|>Hi\n<|assistant|>Hello\n"
                                                "<|assistant|>call\n<|tool|>")


def test_no_prefix_no_anchor_and_a_final_assistant_message_no_boundary() -> None:
    assert _fake(CHAT[1:], window=1, shared=False)[1]["cache_anchor"] is None
    assert _fake(CHAT[:3], window=1)[1]["cache_boundaries"] == (_fake(CHAT)[1]["cache_anchor"],)


def test_a_template_that_refuses_or_hides_the_probe_gives_no_point() -> None:
    tok = FakeTokenizer()
    ids = tok.encode("<|user|>x", False)

    def refuses(messages: Sequence[Mapping[str, Any]]) -> str:
        raise ValueError("roles must alternate")

    for render in (refuses, lambda messages: "<|user|>x"):
        hints = cache_hints(CHAT, render, lambda t: tok.encode(t, False), ids, shared_prefix=True, window=1)
        assert hints == NO_HINTS


@dataclass
class _Engine:
    template: FakeTemplate = field(default_factory=FakeTemplate)
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    info: Any = field(default_factory=lambda: fake_info("m"))
    cache_on: bool = True

    def cache_stats(self) -> PromptCacheStats:
        return PromptCacheStats(enabled=self.cache_on)


def test_request_hints_render_the_profile_system_prompt_and_skip_raw_prompts_and_cacheless_engines() -> None:
    engine, profile = _Engine(), Settings({}, system="Profile says hi.")
    inp = GenerationParams(messages=({"role": "user", "content": "Q"},))
    ids = engine.tokenizer.encode(render_chat(inp, profile, engine.template), False)
    hints = asyncio.run(request_hints(inp, profile, engine, ids, render_chat))  # type: ignore[arg-type]
    assert hints["cache_anchor"] == len("<|system|>Profile says hi.\n<|user|>")
    assert asyncio.run(request_hints(inp, Settings({}), engine, ids, render_chat)) == NO_HINTS  # type: ignore[arg-type]
    raw = GenerationParams(prompt="text")
    assert asyncio.run(request_hints(raw, profile, engine, ids, render_chat)) == NO_HINTS  # type: ignore[arg-type]
    off = _Engine(cache_on=False)  # no prompt cache: no probes either
    assert asyncio.run(request_hints(inp, profile, off, ids, render_chat)) == NO_HINTS  # type: ignore[arg-type]


# --- the real templates and tokenizers (GGUF headers only, no MLX) -----------------------------------


@functools.cache
def _real(which: str) -> tuple[JinjaChatTemplate, GGUFTokenizer]:
    header = read_header(smollm2_path() if which == "smollm2" else gemma_path())
    family = arch_spec(header).family
    return JinjaChatTemplate.from_metadata(header.metadata, family, None), GGUFTokenizer.from_metadata(header.metadata)


def _ids(which: str, messages: Msgs) -> list[int]:
    tpl, tok = _real(which)
    return tok.encode(tpl.render(messages), False)


def _real_hints(which: str, messages: Msgs) -> dict[str, Any]:
    tpl, tok = _real(which)
    hints = cache_hints(messages, tpl.render, lambda t: tok.encode(t, False), _ids(which, messages),
                        shared_prefix=True, window=1)
    return dict(hints)


@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_real_points_are_exactly_where_conversations_part(which: str) -> None:
    other_first = [CHAT[0], {"role": "user", "content": "Quite another question"}]
    edited_last = [*CHAT[:3], {"role": "user", "content": "Something else entirely"}]
    hints, ids = _real_hints(which, CHAT), _ids(which, CHAT)
    assert hints["cache_anchor"] == common_prefix(ids, _ids(which, other_first))
    assert hints["cache_boundaries"][-1] == common_prefix(ids, _ids(which, edited_last))


words = st.lists(st.sampled_from(["alpha", "Beta", "42", "é", "x.y", "(z)", "tool:", "\n", " ", "  ", "\n\n"]),
                 max_size=8).map("".join)
content = st.tuples(st.sampled_from(["Go", "What", "Read", "ok"]), words).map("".join)  # starts with a word


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["smollm2", "gemma"]), content, st.lists(content, min_size=1, max_size=5), content)
def test_real_points_are_shared_by_every_conversation_that_shares_those_messages(
        which: str, system: str, turns: list[str], other: str) -> None:
    msgs = [{"role": "system", "content": system}]
    msgs += [{"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(turns)]
    if msgs[-1]["role"] == "assistant":
        msgs.append({"role": "user", "content": other})
    hints, ids = _real_hints(which, msgs), _ids(which, msgs)
    assert hints["cache_anchor"] is not None
    assert hints["cache_anchor"] <= common_prefix(ids, _ids(which, [msgs[0], {"role": "user", "content": other}]))
    edited = [*msgs[:-1], {"role": "user", "content": other + " then"}]
    assert max(hints["cache_boundaries"]) <= common_prefix(ids, _ids(which, edited))


def test_token_memo_reuses_tokenizations_per_owner_and_stays_bounded() -> None:
    from gmlx_server.serving.cache_points import TokenMemo

    calls: list[str] = []

    def encode(text: str) -> list[int]:
        calls.append(text)
        return [len(text)]

    memo = TokenMemo(size=2)
    assert memo.encode(1, "abc", encode) == [3] and memo.encode(1, "abc", encode) == [3]
    assert calls == ["abc"]  # the second probe of the same prefix is free
    memo.encode(2, "abc", encode)  # another tokenizer: its own entry
    memo.encode(1, "de", encode)  # evicts the oldest, (1, "abc")
    memo.encode(1, "abc", encode)
    assert calls == ["abc", "abc", "de", "abc"]
