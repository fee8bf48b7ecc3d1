"""The official openai SDK's Responses API against a real `gmlx serve` process and the real default model."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.server import LiveServer

pytestmark = pytest.mark.slow
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def client(default_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=default_server.v1, api_key="unused", max_retries=0, timeout=120)


def test_create_and_stream_agree(client: openai.OpenAI) -> None:
    r = client.responses.create(model="smollm2", input=QUESTION, instructions="Answer in one sentence.",
                                temperature=0, max_output_tokens=24)
    assert "Paris" in r.output_text and r.status in ("completed", "incomplete")
    assert r.usage is not None and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    with client.responses.stream(model="smollm2", input=QUESTION, instructions="Answer in one sentence.",
                                 temperature=0, max_output_tokens=24) as stream:
        events = list(stream)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == r.output_text
    assert events[0].type == "response.created" and events[-1].type == f"response.{r.status}"
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_two_turns_through_previous_response_id(client: openai.OpenAI) -> None:
    hello = "My name is Ada. Say hello to me."
    first = client.responses.create(model="smollm2", input=hello, temperature=0, max_output_tokens=16)
    second = client.responses.create(model="smollm2", input="What is my name?", previous_response_id=first.id,
                                     temperature=0, max_output_tokens=16)
    assert second.previous_response_id == first.id and second.output_text
    # The chained turn is exactly the conversation replayed by hand: same prompt, same greedy answer.
    replay = client.responses.create(model="smollm2", temperature=0, max_output_tokens=16, input=[
        {"role": "user", "content": hello}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"}])
    assert second.usage is not None and replay.usage is not None and first.usage is not None
    assert second.usage.input_tokens == replay.usage.input_tokens > first.usage.input_tokens
    assert second.output_text == replay.output_text


def test_unknown_previous_response_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        client.responses.create(model="smollm2", input="hi", previous_response_id="resp_unknown",
                                max_output_tokens=4)
    assert "previous_response_not_found" in str(nf.value.body)
    with pytest.raises(openai.BadRequestError, match="prompt is too long"):
        client.responses.create(model="smollm2", input=QUESTION, max_output_tokens=100_000)
