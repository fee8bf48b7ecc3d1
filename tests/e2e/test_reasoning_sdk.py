"""The reasoning channel through the official SDKs, on a real `gmlx serve` of a real Qwen3-architecture GGUF
whose output holds a thinking block (tests/thinking_model.py: Qwen's tokenizer and template, weights that
write `<think>The user asks for the capital.</think>\\n\\nParis`).

Every protocol returns the block apart from the answer, streamed and not: chat completions'
`reasoning_content` / `reasoning`, Anthropic thinking blocks with a signature, Responses reasoning items.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import qwen_coder_path
from tests.e2e.server import LiveServer, gmlx_serve
from tests.e2e.test_request_log_live import line_of
from tests.thinking_model import ANSWER, REASONING, thinking_qwen3

pytestmark = pytest.mark.slow
DATA = Path(__file__).resolve().parents[1] / "data" / "templates"
ASK: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
THOUGHT_TOKENS = 9  # <think>, the seven words and stop, </think>


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("reasoning")
    qwen3 = DATA.joinpath("qwen3.jinja").read_text()
    model = thinking_qwen3(qwen_coder_path("0.5b"), qwen3)
    opened = tmp / "opens_think.jinja"  # DeepSeek-R1's way: the generation prompt opens the block
    opened.write_text(qwen3.replace("{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n<think>' }}"))
    assert opened.read_text() != qwen3
    config = tmp / "gmlx.yaml"
    config.write_text(f"models:\n  think:\n    path: {model}\n    reasoning_budgets: {{low: 2}}\n"
                      f"  raw:\n    path: {model}\n    reasoning_format: raw\n"
                      f"  r1:\n    path: {model}\n    chat_template: {opened}\n")
    with gmlx_serve(["--config", str(config)], tmp) as s:
        yield s


def _chat(oai: openai.OpenAI, **extra: Any) -> Any:
    body = {"model": "think", "messages": ASK, "max_tokens": 40, **extra}
    return oai.chat.completions.create(**body)


def test_chat_returns_reasoning_apart_from_the_answer(oai: openai.OpenAI) -> None:
    r = _chat(oai)
    msg = r.choices[0].message
    assert msg.content == ANSWER and r.choices[0].finish_reason == "stop"
    assert msg.model_extra["reasoning_content"] == msg.model_extra["reasoning"] == REASONING
    assert r.usage.completion_tokens_details.reasoning_tokens == THOUGHT_TOKENS
    assert r.usage.completion_tokens == THOUGHT_TOKENS + 3  # "\n\n", Paris, <|im_end|>


def test_chat_streams_reasoning_deltas_before_the_answer(oai: openai.OpenAI) -> None:
    thought, answer, order = [], [], []
    for chunk in _chat(oai, stream=True, stream_options={"include_usage": True}):
        if not chunk.choices:
            assert chunk.usage.completion_tokens_details.reasoning_tokens == THOUGHT_TOKENS
            continue
        delta = chunk.choices[0].delta
        extra = delta.model_extra or {}
        if extra.get("reasoning_content"):
            thought.append(extra["reasoning_content"])
            assert extra["reasoning"] == extra["reasoning_content"] and not delta.content
            order.append("r")
        if delta.content:
            answer.append(delta.content)
            order.append("a")
    assert "".join(thought) == REASONING and "".join(answer) == ANSWER
    assert len(thought) > 1 and order == sorted(order, reverse=True)  # token by token, reasoning first


def _prometheus_reasoning(server: LiveServer) -> float:
    text = httpx.get(server.v1 + "/metrics", params={"format": "prometheus"}, timeout=10).text
    lines = [x for x in text.splitlines() if x.startswith('gmlx_reasoning_tokens_total{model="think"}')]
    return float(lines[0].split()[-1]) if lines else 0.0  # no row before the model's first request


def _metrics_tokens(server: LiveServer) -> dict[str, int]:
    tokens = httpx.get(server.v1 + "/metrics", timeout=10).json()["server"]["tokens"]["by_model"]
    return dict(tokens.get("think", {"generated": 0, "reasoning": 0}))


def test_reasoning_tokens_in_the_request_log_and_metrics(oai: openai.OpenAI, server: LiveServer) -> None:
    before, counted = _prometheus_reasoning(server), _metrics_tokens(server)
    r = _chat(oai)
    line = line_of(server, r.id)
    assert (line["reasoning_tokens"], line["generated_tokens"]) == (str(THOUGHT_TOKENS), str(THOUGHT_TOKENS + 3))
    assert _prometheus_reasoning(server) - before == THOUGHT_TOKENS
    after = _metrics_tokens(server)  # /v1/metrics (what gmlx top shows): the thought apart from all generated
    assert (after["reasoning"] - counted["reasoning"], after["generated"] - counted["generated"]) == (
        THOUGHT_TOKENS, THOUGHT_TOKENS + 3)


def test_thinking_off_leaves_no_reasoning(oai: openai.OpenAI) -> None:
    for extra in ({"extra_body": {"enable_thinking": False}}, {"reasoning_effort": "none"}):
        msg = _chat(oai, **extra).choices[0].message
        assert msg.content == ANSWER and "reasoning_content" not in (msg.model_extra or {})


def test_thinking_that_spends_max_tokens_ends_by_length_with_its_reasoning(oai: openai.OpenAI) -> None:
    r = _chat(oai, max_tokens=4)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "length" and msg.content == ""
    assert msg.model_extra["reasoning_content"] == "The user asks"
    assert r.usage.completion_tokens_details.reasoning_tokens == 4


def test_budget_and_configured_effort_close_the_block(oai: openai.OpenAI) -> None:
    for extra in ({"extra_body": {"thinking_budget": 2}}, {"reasoning_effort": "low"}):  # low: 2 in the config
        msg = _chat(oai, **extra).choices[0].message
        assert msg.model_extra["reasoning_content"] == "The user" and msg.content == ANSWER


def test_a_prompt_that_opens_the_block_and_raw_format(oai: openai.OpenAI) -> None:
    msg = oai.chat.completions.create(model="r1", messages=ASK, max_tokens=40).choices[0].message
    assert msg.model_extra["reasoning_content"] == REASONING and msg.content == ANSWER
    raw = oai.chat.completions.create(model="raw", messages=ASK, max_tokens=40).choices[0].message
    assert raw.content == f"<think>{REASONING}</think>\n\n{ANSWER}" and "reasoning_content" not in raw.model_extra


def test_history_reasoning_reaches_the_template(oai: openai.OpenAI, server: LiveServer) -> None:
    """Qwen3's template renders the reasoning of turns after the last user query: sent back as
    reasoning_content, it is in the prompt (the token count grows by it), within a tool loop."""
    call = {"id": "call_1", "type": "function", "function": {"name": "look", "arguments": "{}"}}
    turn = [*ASK, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Paris"}]
    with_thought = [*ASK, {**turn[1], "reasoning_content": REASONING}, turn[2]]
    usage = [oai.chat.completions.create(model="think", messages=m, max_tokens=1).usage.prompt_tokens
             for m in (turn, with_thought)]
    assert usage[1] >= usage[0] + 7  # the seven words of the thought


def test_anthropic_thinking_blocks_typed_by_the_sdk(claude: anthropic.Anthropic) -> None:
    msg = claude.messages.create(model="think", max_tokens=40, messages=ASK,
                                 thinking={"type": "enabled", "budget_tokens": 1024})
    thinking, text = msg.content
    assert isinstance(thinking, anthropic.types.ThinkingBlock) and thinking.thinking == REASONING
    assert len(thinking.signature) > 20 and isinstance(text, anthropic.types.TextBlock) and text.text == ANSWER
    deltas = []
    with claude.messages.stream(model="think", max_tokens=40, messages=ASK, thinking={"type": "adaptive"}) as s:
        for event in s:
            if event.type == "content_block_delta" and event.delta.type == "thinking_delta":
                deltas.append(event.delta.thinking)
        final = s.get_final_message()
    assert "".join(deltas) == REASONING and len(deltas) > 1
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].signature == thinking.signature  # the same thought, the same signature


def test_anthropic_budget_and_max_tokens(claude: anthropic.Anthropic) -> None:
    msg = claude.messages.create(model="think", max_tokens=40, messages=ASK,
                                 thinking={"type": "enabled", "budget_tokens": 2})
    assert msg.content[0].thinking == "The user"  # type: ignore[union-attr]
    cut = claude.messages.create(model="think", max_tokens=4, messages=ASK)
    assert cut.stop_reason == "max_tokens" and [b.type for b in cut.content] == ["thinking"]
    off = claude.messages.create(model="think", max_tokens=40, messages=ASK, thinking={"type": "disabled"})
    assert [(b.type, getattr(b, "text", None)) for b in off.content] == [("text", ANSWER)]


def test_claude_code_replay_with_signed_thinking_stays_cache_warm(claude: anthropic.Anthropic) -> None:
    """Turn after turn, the history carries the thinking blocks (with signatures) and redacted ones the
    previous answers had; each turn is answered, and its prefix comes from the prompt cache."""
    tools: list[Any] = [{"name": "look", "description": "Look something up.",
                         "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}]
    messages: list[Any] = list(ASK)
    cached, prompts = [], []
    for step in range(3):
        msg = claude.messages.create(model="think", max_tokens=40, messages=messages, tools=tools,
                                     system="You are Claude Code.", thinking={"type": "enabled", "budget_tokens": 64})
        assert msg.content[0].type == "thinking" and msg.content[-1].type == "text"
        prompts.append(msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0))
        cached.append(msg.usage.cache_read_input_tokens or 0)
        blocks = [b.model_dump(exclude_none=True) for b in msg.content]
        blocks.insert(1, {"type": "redacted_thinking", "data": "EmwKAhgB"})
        blocks.append({"type": "tool_use", "id": f"toolu_{step}", "name": "look", "input": {"q": "x"}})
        messages += [{"role": "assistant", "content": blocks},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{step}",
                                                   "content": "Paris"}]}]
    assert prompts[0] < prompts[1] < prompts[2]
    assert all(cached[i] >= prompts[i - 1] - 4 for i in (1, 2)), (cached, prompts)
    # The thinking blocks sent back reach Qwen3's template: the three thoughts are in the prompt.
    bare: list[Any] = [{**m, "content": [b for b in m["content"] if b["type"] != "thinking"]}
                       if m["role"] == "assistant" else m for m in messages]
    counts = [claude.messages.count_tokens(model="think", messages=m, tools=tools, system="You are Claude Code.")
              .input_tokens for m in (messages, bare)]
    assert counts[0] >= counts[1] + 3 * 7, counts


def test_responses_reasoning_items(oai: openai.OpenAI) -> None:
    r = oai.responses.create(model="think", input="What is the capital of France?", max_output_tokens=40)
    kinds = [item.type for item in r.output]
    assert kinds == ["reasoning", "message"] and r.output_text == ANSWER
    assert r.output[0].content[0].text == REASONING  # type: ignore[union-attr,index]
    assert r.usage.output_tokens_details.reasoning_tokens == THOUGHT_TOKENS
    deltas = [e.delta for e in oai.responses.create(model="think", input="Capital of France?", max_output_tokens=40,
                                                     stream=True) if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == REASONING
    cut = oai.responses.create(model="think", input="What is the capital of France?", max_output_tokens=4)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"  # type: ignore[union-attr]
    assert cut.output[0].content[0].text == "The user asks" and cut.output_text == ""  # type: ignore[union-attr,index]


def test_codex_shaped_input_with_reasoning_items_is_answered(oai: openai.OpenAI) -> None:
    first = oai.responses.create(model="think", input="What is the capital of France?", max_output_tokens=40)
    history: list[Any] = [{"role": "user", "content": "What is the capital of France?"},
                          {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"},
                          first.output[0].model_dump(exclude_none=True),
                          {"type": "function_call", "call_id": "call_1", "name": "look", "arguments": "{}"},
                          {"type": "function_call_output", "call_id": "call_1", "output": "Paris"}]
    r = oai.responses.create(model="think", input=history, max_output_tokens=40,
                             tools=[{"type": "function", "name": "look", "parameters": {"type": "object"}}])
    assert r.status == "completed" and r.output_text == ANSWER
    bare = oai.responses.create(model="think", input=[h for h in history if h.get("type") != "reasoning"],
                                max_output_tokens=1)
    assert r.usage.input_tokens > bare.usage.input_tokens  # the reasoning item was rendered into the prompt
