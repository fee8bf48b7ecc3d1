"""The reasoning splitter, the template families, the effort budgets and the Responses / chat history input."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gmlx_server.config.settings import ModelEntry
from gmlx_server.engine.chat_template import JinjaChatTemplate
from gmlx_server.engine.thinking import MISTRAL_THINK, SEED_THINK, THINK, ReasoningUse, infer_reasoning
from gmlx_server.engine.tool_syntax import HERMES, ToolUse
from gmlx_server.engine.types import TokenEvent
from gmlx_server.errors import InvalidRequest
from gmlx_server.generation_params import GenerationParams
from gmlx_server.protocol.openai import parse_chat
from gmlx_server.protocol.openai_out import OpenAIEncoder, ResponseMeta
from gmlx_server.protocol.reasoning_split import ReasoningSplitter, with_reasoning
from gmlx_server.protocol.responses import parse_responses
from gmlx_server.protocol.tool_calls import with_tool_calls
from gmlx_server.serving.reasoning import with_effort_budget

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "templates"


def _split(pieces: list[str], starts_inside: bool = False) -> tuple[str, str]:
    s = ReasoningSplitter("<think>", "</think>", starts_inside)
    reasoning, answer = "", ""
    for piece in pieces:
        r, a = s.feed(piece)
        reasoning, answer = reasoning + r, answer + a
    r, a = s.finish()
    return reasoning + r, answer + a


CASES = [
    ("<think>\nHmm, Paris.\n</think>\n\nParis", False, ("Hmm, Paris.", "Paris")),
    ("  <think>a b</think>c", False, ("a b", "c")),
    ("Paris <think>no</think>", False, ("", "Paris <think>no</think>")),  # a block opens only at the start
    ("\nstill thinking\n</think>\n\nParis", True, ("still thinking", "Paris")),
    ("<think>\ncut short  \n", False, ("cut short", "")),  # max_tokens inside the block
    ("<thi", False, ("", "<thi")),  # a partial tag that never completed is text
    ("<think>a </thin", False, ("a </thin", "")),
    ("", False, ("", "")),
]


@pytest.mark.parametrize(("text", "inside", "expected"), CASES)
def test_split_whole(text: str, inside: bool, expected: tuple[str, str]) -> None:
    assert _split([text], inside) == expected


@given(st.sampled_from(CASES), st.lists(st.integers(0, 40), max_size=8))
def test_any_chunking_splits_the_same(case: tuple[str, bool, tuple[str, str]], cuts: list[int]) -> None:
    text, inside, expected = case
    at = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *at], [*at, len(text)], strict=True)]
    assert _split(pieces, inside) == expected


def test_families_come_from_the_template() -> None:
    assert infer_reasoning((TEMPLATES / "qwen3.jinja").read_text()) is THINK
    assert infer_reasoning((TEMPLATES / "qwen2.5.jinja").read_text()) is None
    assert infer_reasoning("{{ '<seed:think>' }}{{ '</seed:think>' }}") is SEED_THINK
    assert infer_reasoning("[THINK]{{ x }}[/THINK]") is MISTRAL_THINK


def _encoder() -> tuple[OpenAIEncoder, object]:
    base = OpenAIEncoder(ResponseMeta("id", "m", 0, 3), tokenizer=None)  # type: ignore[arg-type]
    return base, with_reasoning(base, base, ReasoningUse(THINK))


def test_reasoning_tokens_are_counted_apart() -> None:
    base, enc = _encoder()
    for i, text in enumerate(["<think>", "a", " b", "</think>", "\n\n", "Paris"]):
        enc.feed(TokenEvent(text, i))  # type: ignore[attr-defined]
    enc.feed(TokenEvent("", None, finish_reason="stop"))  # type: ignore[attr-defined]
    body = base.body()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Paris", "reasoning_content": "a b",
                                             "reasoning": "a b"}
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 4}


def _entry(**kw: object) -> ModelEntry:
    return ModelEntry(id="m", path="/x.gguf", **kw)  # type: ignore[arg-type]


def test_effort_maps_to_a_budget() -> None:
    qwen3 = JinjaChatTemplate((TEMPLATES / "qwen3.jinja").read_text(), "test")
    plain = JinjaChatTemplate((TEMPLATES / "qwen2.5.jinja").read_text(), "test")
    effort = GenerationParams(messages=({"role": "user", "content": "x"},), reasoning_effort="low")
    assert with_effort_budget(effort, _entry(), qwen3).thinking_budget == 1024  # the default
    assert with_effort_budget(effort, _entry(reasoning_budgets={"low": 7}), qwen3).thinking_budget == 7
    assert with_effort_budget(effort, _entry(), plain).thinking_budget is None  # the template does not think
    high = GenerationParams(messages=effort.messages, reasoning_effort="high")
    assert with_effort_budget(high, _entry(), qwen3).thinking_budget is None  # no cap by default
    explicit = GenerationParams(messages=effort.messages, reasoning_effort="low", thinking_budget=3)
    assert with_effort_budget(explicit, _entry(), qwen3).thinking_budget == 3


def test_responses_reasoning_items_join_the_assistant_turn() -> None:
    items = [{"role": "user", "content": "q"},
             {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "t"}]},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
             {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "opaque"}]
    msgs = parse_responses({"input": items}).with_history(()).messages
    assert msgs[1]["reasoning_content"] == "t" and msgs[1]["tool_calls"][0]["function"]["name"] == "f"
    assert len(msgs) == 2  # encrypted reasoning holds nothing a local model can read
    with pytest.raises(InvalidRequest) as e:
        parse_responses({"input": [{"type": "reasoning", "summary": "x"}]})
    assert e.value.param == "input[0].summary"


def test_chat_history_reasoning_must_be_text() -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_chat({"messages": [{"role": "assistant", "content": "a", "reasoning_content": {"x": 1}}]})
    assert e.value.param == "messages[0].reasoning_content"


def test_a_call_written_inside_the_thinking_block_is_reasoning() -> None:
    """Qwen3's family (as vLLM reads it): calls are read from the answer only; one drafted while thinking is
    part of the thought, and the answer's own call is the call."""
    base = OpenAIEncoder(ResponseMeta("id", "m", 0, 3), tokenizer=None)  # type: ignore[arg-type]
    tools = ({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},)
    params = GenerationParams(messages=({"role": "user", "content": "x"},), tools=tools)
    enc = with_reasoning(with_tool_calls(base, params, ToolUse(HERMES, "template")), base, ReasoningUse(THINK))
    draft = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    for i, text in enumerate(["<think>", f"maybe {draft}", "</think>\n\n", draft.replace("1", "2")]):
        enc.feed(TokenEvent(text, i))
    enc.feed(TokenEvent("", None, finish_reason="stop"))
    message = base.body()["choices"][0]["message"]
    assert message["reasoning_content"] == f"maybe {draft}"
    assert [c["function"]["arguments"] for c in message["tool_calls"]] == ['{"a": 2}']
