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

from gmlx_plan.gguf_header import read_header
from gmlx_server.engine.chat_template import FAMILY_TEMPLATES, JinjaChatTemplate
from gmlx_server.errors import InvalidRequest
from gmlx_server.generation_params import GenerationParams
from gmlx_server.serving.addressing import Settings
from gmlx_server.serving.generation import render_messages, tokenize
from gmlx_server.serving.roles import fold_system, merge_roles
from tests.conftest import smollm2_path
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


# Every role a protocol parser hands on (developer too, as a template may see it), and tool calls and results.
KINDS = st.sampled_from(["system", "developer", "user", "assistant", "assistant_call", "tool"])
FAMILIES = {**{f"family:{n}": t for n, t in FAMILY_TEMPLATES.items()},
            **{p.stem: p.read_text() for p in sorted(TEMPLATES.glob("*.jinja"))},
            "smollm2 (its GGUF's own)": str(read_header(smollm2_path()).metadata["tokenizer.chat_template"])}


def message(kind: str, i: int) -> dict[str, Any]:
    if kind == "assistant_call":  # OpenAI's shape after parsing: no content, arguments as an object
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": f"fn_{i}", "arguments": {"n": i}}}]}
    if kind == "tool":
        return {"role": "tool", "content": f"result {i}", "tool_call_id": f"call_{i}"}
    return {"role": kind, "content": f"turn {i}"}


@pytest.mark.parametrize("name", sorted(FAMILIES))
@settings(max_examples=60, deadline=None)
@given(kinds=st.lists(KINDS, min_size=1, max_size=8))
def test_no_role_sequence_breaks_a_bundled_template(name: str, kinds: list[str]) -> None:
    """Render only: whatever the order, the template renders, and no user turn or tool result is lost."""
    messages = tuple(message(k, i) for i, k in enumerate(kinds))
    text, _ = _render(JinjaChatTemplate(FAMILIES[name], name), messages)
    for m in messages:
        if m["role"] in ("user", "tool"):
            assert m["content"] in text


def test_a_tool_history_without_tools_renders_on_templates_without_a_tool_role() -> None:
    """pi's compaction summary: the tool history of the session, no tools offered. Gemma's template refuses
    the order, SmolLM2's a call without content: both get the calls and results as plain turns."""
    history = (message("system", 0), message("user", 1), message("assistant_call", 2), message("tool", 3),
               message("tool", 4), message("assistant", 5), message("user", 6))
    smollm2 = JinjaChatTemplate(FAMILIES["smollm2 (its GGUF's own)"], "gguf")
    for template in (GEMMA, smollm2):
        text, repaired = _render(template, history)
        assert repaired is not None and repaired.startswith("wrote tool calls and results as plain turns")
        assert '<tool_call>\n{"name": "fn_2", "arguments": {"n": 2}}\n</tool_call>' in text
        assert "<tool_response>\nresult 3\n</tool_response>\n<tool_response>\nresult 4" in text
