"""Tool calls, structured output and logprobs through the official SDKs against a real `gmlx serve`
running SmolLM2 twice: with its own template (no tool syntax) and with a Hermes-style override.

The tool requests replay tests/data/tool_outputs/smollm2_hermes_captured.json: a history with two
earlier calls and no tool results, greedy, which makes the 135M model write a real parsed call.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import anthropic
import jsonschema
import mlx.core as mx
import openai
import pytest

from gmlx_server.engine.loader import load_gguf_model
from tests.conftest import smollm2_path
from tests.e2e.server import ROOT, LiveServer, gmlx_serve

pytestmark = pytest.mark.slow
CAPTURED = json.loads((ROOT / "tests/data/tool_outputs/smollm2_hermes_captured.json").read_text())
TOOLS: list[Any] = CAPTURED["tools"]
WEATHER_SCHEMA = TOOLS[0]["function"]["parameters"]
CASES = {c["name"]: c for c in CAPTURED["cases"]}
TOP_K = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("serve")
    config = tmp / "gmlx.yaml"
    config.write_text(f"models:\n  smollm2:\n    path: {smollm2_path()}\n"
                      f"  smollm2-hermes:\n    path: {smollm2_path()}\n"
                      f"    chat_template: {ROOT / 'tests/data/hermes_template.jinja'}\n")
    with gmlx_serve(["--config", str(config)], tmp, env={"TOP_LOGPROBS_K": str(TOP_K)}) as s:
        yield s


def _check_call(name: str, arguments: Any, city: str) -> None:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, WEATHER_SCHEMA)
    assert (name, args) == ("get_weather", {"city": city})


# --- tools ----------------------------------------------------------------------------------------

def test_openai_tool_call_parsed_from_the_real_model(oai: openai.OpenAI, server: LiveServer) -> None:
    r = oai.chat.completions.create(model="smollm2-hermes", messages=CASES["two_shot_paris_greedy"]["messages"],
                                    tools=TOOLS, temperature=0, max_tokens=40)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    [call] = choice.message.tool_calls or []
    assert call.id.startswith("call_") and call.type == "function"
    _check_call(call.function.name, call.function.arguments, "Paris")
    assert "defines the hermes tool-call syntax" in server.log()


def test_openai_streamed_tool_call(oai: openai.OpenAI) -> None:
    with oai.chat.completions.stream(model="smollm2-hermes", messages=CASES["two_shot_tokyo_greedy"]["messages"],
                                     tools=TOOLS, temperature=0, max_tokens=40) as stream:
        kinds = {type(e).__name__ for e in stream}
        final = stream.get_final_completion()
    assert "FunctionToolCallArgumentsDeltaEvent" in kinds
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    _check_call(call.function.name, call.function.arguments, "Tokyo")


def test_a_template_syntax_is_enforced_for_a_required_call(oai: openai.OpenAI) -> None:
    """The Hermes template's own <tool_call> syntax, held to a valid call by the grammar: no history needed."""
    for seed in (1, 2):
        r = oai.chat.completions.create(model="smollm2-hermes", tools=TOOLS, tool_choice="required", seed=seed,
                                        messages=[{"role": "user", "content": "Is it raining in Tokyo?"}],
                                        temperature=0.8, max_tokens=64)
        [call] = r.choices[0].message.tool_calls or []
        assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER_SCHEMA)


def _anthropic_history() -> list[Any]:
    """The captured OpenAI history as Anthropic messages: calls become tool_use blocks."""
    out: list[Any] = []
    for m in CASES["two_shot_paris_greedy"]["messages"]:
        if m["role"] == "user":
            out.append({"role": "user", "content": m["content"]})
            continue
        fn = m["tool_calls"][0]
        out.append({"role": "assistant", "content": [{"type": "tool_use", "id": fn["id"], "name": "get_weather",
                                                      "input": json.loads(fn["function"]["arguments"])}]})
    return out


def test_anthropic_tool_use_block_stream_and_not(claude: anthropic.Anthropic) -> None:
    body: dict[str, Any] = {
        "model": "smollm2-hermes", "max_tokens": 40, "messages": _anthropic_history(),
        "tools": [{"name": "get_weather", "description": TOOLS[0]["function"]["description"],
                   "input_schema": WEATHER_SCHEMA}],
        "extra_body": {"temperature": 0}}
    msg = claude.messages.create(**body)
    assert msg.stop_reason == "tool_use"
    [block] = [b for b in msg.content if b.type == "tool_use"]
    assert block.id.startswith("toolu_")
    _check_call(block.name, block.input, "Paris")
    with claude.messages.stream(**body) as stream:
        final = stream.get_final_message()
    [streamed] = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use"
    _check_call(streamed.name, streamed.input, "Paris")


def test_responses_function_call_item(oai: openai.OpenAI) -> None:
    items: list[Any] = []
    for m in CASES["two_shot_tokyo_greedy"]["messages"]:
        calls = m.get("tool_calls") or []
        items += [{"type": "function_call", "call_id": c["id"], "name": c["function"]["name"],
                   "arguments": c["function"]["arguments"]} for c in calls]
        if not calls:
            items.append({"role": m["role"], "content": m["content"]})
    fn = TOOLS[0]["function"]
    r = oai.responses.create(model="smollm2-hermes", input=items, temperature=0, max_output_tokens=40,
                             tools=[{"type": "function", "name": fn["name"], "parameters": fn["parameters"],
                                     "strict": None}])
    [call] = [o for o in r.output if o.type == "function_call"]
    assert call.call_id.startswith("call_") and r.status == "completed"
    _check_call(call.name, call.arguments, "Tokyo")


def test_own_template_gets_gmlx_tool_prompt_and_answers_in_text_when_no_call_helps(oai: openai.OpenAI,
                                                                                    server: LiveServer) -> None:
    r = oai.chat.completions.create(
        model="smollm2", tools=TOOLS, temperature=0, max_tokens=32,
        messages=[{"role": "user", "content": "What is the capital of France? Answer in one word."}])
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert "Paris" in (choice.message.content or "")
    assert "defines no tool-call syntax" in server.log()


# --- structured output ----------------------------------------------------------------------------

CITY = {"type": "object", "additionalProperties": False, "required": ["city", "population"],
        "properties": {"city": {"type": "string", "maxLength": 20},
                       "population": {"type": "integer", "minimum": 0, "maximum": 100_000_000}}}
ASK = [{"role": "user", "content": "Name a city and its population as JSON."}]


def test_response_format_json_schema_output_validates(oai: openai.OpenAI, server: LiveServer) -> None:
    r = oai.chat.completions.create(model="smollm2", messages=ASK, temperature=0, max_tokens=48,  # type: ignore[arg-type]
                                    response_format={"type": "json_schema",
                                                     "json_schema": {"name": "city", "schema": CITY}})
    assert r.choices[0].finish_reason == "stop"  # the grammar completed: the engine stopped there
    jsonschema.validate(json.loads(r.choices[0].message.content or ""), CITY)
    assert "llguidance tokenizer built in" in server.log()


def test_anthropic_output_config_validates(claude: anthropic.Anthropic) -> None:
    msg = claude.messages.create(model="smollm2", max_tokens=48, messages=ASK,  # type: ignore[arg-type]
                                 extra_body={"temperature": 0.8, "seed": 3,
                                             "output_config": {"format": {"type": "json_schema", "schema": CITY}}})
    assert msg.stop_reason == "end_turn"
    jsonschema.validate(json.loads("".join(b.text for b in msg.content if b.type == "text")), CITY)


def test_malformed_schema_is_a_bad_request(oai: openai.OpenAI) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "required": "city"}}}
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="smollm2", messages=ASK, max_tokens=8, response_format=bad)  # type: ignore[arg-type]
    assert e.value.body["param"] == "response_format.json_schema.schema"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model="smollm2", messages=ASK, max_tokens=8,  # type: ignore[arg-type]
                                    response_format={"type": "yaml"})  # type: ignore[typeddict-item]


# --- logprobs -------------------------------------------------------------------------------------

COLOR = [{"role": "user", "content": "Name a color."}]


def _reference(generated: list[bytes]) -> float:
    """Teacher-forced sequence logprob of the generated tokens, on an in-process load of the same model."""
    loaded = load_gguf_model(smollm2_path())
    by_bytes: dict[bytes, int] = {}
    for i in range(loaded.tokenizer.vocab_size):
        by_bytes.setdefault(loaded.tokenizer.token_bytes(i), i)
    prompt = loaded.tokenizer.encode(loaded.template.render(COLOR, add_generation_prompt=True),
                                     add_special_tokens=False)
    gen = [by_bytes[b] for b in generated]
    logits = loaded.model(mx.array([prompt + gen])).logits[0].astype(mx.float32)
    lsm = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    rows = mx.arange(len(prompt) - 1, len(prompt) + len(gen) - 1)
    return float(mx.sum(lsm[rows, mx.array(gen)]).item())


def test_logprobs_sum_to_the_sequence_logprob(oai: openai.OpenAI) -> None:
    r = oai.chat.completions.create(model="smollm2", messages=COLOR, temperature=0, max_tokens=8,  # type: ignore[arg-type]
                                    logprobs=True, top_logprobs=5)
    items = r.choices[0].logprobs.content or []  # type: ignore[union-attr]
    assert len(items) == r.usage.completion_tokens  # type: ignore[union-attr]
    for item in items:
        tops = [t.logprob for t in item.top_logprobs]
        assert len(tops) == TOP_K and tops == sorted(tops, reverse=True)  # capped by TOP_LOGPROBS_K
        assert item.top_logprobs[0].token == item.token  # greedy picks the most likely
    assert "".join(i.token for i in items) == r.choices[0].message.content
    chunks = list(oai.chat.completions.create(model="smollm2", messages=COLOR, temperature=0, max_tokens=8,  # type: ignore[arg-type]
                                              logprobs=True, top_logprobs=5, stream=True))
    streamed = [i for c in chunks if c.choices and c.choices[0].logprobs
                for i in c.choices[0].logprobs.content or []]
    # The repeat hits the prompt cache (only the last prompt token is prefilled), so the logprobs agree to
    # float rounding, not bit for bit.
    assert [i.token for i in streamed] == [i.token for i in items]
    assert all(math.isclose(a.logprob, b.logprob, abs_tol=1e-3) for a, b in zip(streamed, items, strict=True))
    total = sum(i.logprob for i in items)
    assert math.isclose(total, _reference([bytes(i.bytes or []) for i in items]), abs_tol=1e-2)

