"""Role repair before the template: the message orders harnesses send (Codex: developer, developer, user,
user; opencode's title request: system, user, user) render on Gemma's template, a template that accepts them
sees them unchanged, and no random role sequence makes any bundled template family fail."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gmlx_server.engine.chat_template import FAMILY_TEMPLATES, JinjaChatTemplate
from gmlx_server.errors import InvalidRequest
from gmlx_server.neutral import GenerationParams
from gmlx_server.service.addressing import Settings
from gmlx_server.service.generate import render_messages, tokenize
from gmlx_server.service.roles import fold_system, merge_roles
from tests.fakes import FakeTokenizer

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "templates"
GEMMA = JinjaChatTemplate(FAMILY_TEMPLATES["gemma"], "family:gemma")
CODEX = ({"role": "developer", "content": "You are Codex."}, {"role": "developer", "content": "Be terse."},
         {"role": "user", "content": "Context: repo."}, {"role": "user", "content": "Say hi."})
OPENCODE_TITLE = ({"role": "system", "content": "Make a title."}, {"role": "user", "content": "first"},
                  {"role": "user", "content": "second"})


def _render(template: Any, messages: tuple[dict[str, Any], ...], **kw: Any) -> tuple[str, str | None]:
    return render_messages(GenerationParams(messages=messages, **kw), Settings({}), template)


def test_merge_and_fold() -> None:
    assert merge_roles(CODEX) == [{"role": "system", "content": "You are Codex.\n\nBe terse."},
                                  {"role": "user", "content": "Context: repo.\n\nSay hi."}]
    assert fold_system(OPENCODE_TITLE) == [{"role": "user", "content": "Make a title.\n\nfirst\n\nsecond"}]
    parts = [{"type": "text", "text": "b"}]
    assert merge_roles([{"role": "user", "content": "a"}, {"role": "user", "content": parts}])[0]["content"] == [
        {"type": "text", "text": "a"}, {"type": "text", "text": "\n\n"}, *parts]
    calls = [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
             {"role": "tool", "content": "x", "tool_call_id": "1"},
             {"role": "tool", "content": "y", "tool_call_id": "2"}]
    assert merge_roles(calls) == calls  # tool turns and calls are never merged


@pytest.mark.parametrize("messages", [CODEX, OPENCODE_TITLE], ids=["codex", "opencode-title"])
def test_harness_orders_render_on_gemma_and_say_what_was_repaired(messages: tuple[dict[str, Any], ...]) -> None:
    text, repaired = _render(GEMMA, messages)
    assert repaired is not None and "refused them as sent" in repaired
    assert "Say hi." in text or "second" in text
    assert text.count("<start_of_turn>user") == 1  # one user turn, as Gemma's template wants


def test_a_template_that_accepts_the_messages_sees_them_unchanged() -> None:
    chatml = JinjaChatTemplate(FAMILY_TEMPLATES["chatml"], "family:chatml")
    text, repaired = _render(chatml, OPENCODE_TITLE)
    assert repaired is None and text.count("<|im_start|>user") == 2


def test_the_repair_is_logged_once_and_an_unrepairable_request_names_the_protocols_field(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gmlx.generate")
    tokenize(GenerationParams(messages=CODEX), Settings({}), GEMMA, FakeTokenizer(), "gemma", 10_000)
    assert sum("merged" in r.message for r in caplog.records) == 1
    broken = JinjaChatTemplate("{{ raise_exception('never') }}", "config")
    with pytest.raises(InvalidRequest) as e:
        _render(broken, CODEX, messages_param="input")
    assert e.value.param == "input" and "never" in e.value.message


ROLES = st.sampled_from(["system", "user", "assistant"])  # the protocol parsers already make developer system
FAMILIES = {**{f"family:{n}": t for n, t in FAMILY_TEMPLATES.items()},
            **{p.stem: p.read_text() for p in sorted(TEMPLATES.glob("*.jinja"))}}


@pytest.mark.parametrize("name", sorted(FAMILIES))
@settings(max_examples=40, deadline=None)
@given(roles=st.lists(ROLES, min_size=1, max_size=8))
def test_no_role_sequence_breaks_a_bundled_template(name: str, roles: list[str]) -> None:
    messages = tuple({"role": r, "content": f"turn {i}"} for i, r in enumerate(roles))
    template = JinjaChatTemplate(FAMILIES[name], name)
    text, _ = _render(template, messages)
    assert "turn" in text
