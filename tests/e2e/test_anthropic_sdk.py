"""The official anthropic SDK against a real `gmlx serve` process serving the real default model (SmolLM2)."""

from __future__ import annotations

import anthropic
import pytest

from tests.e2e.server import LiveServer

pytestmark = pytest.mark.slow
GREEDY = {"temperature": 0}
QUESTION: list[anthropic.types.MessageParam] = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(default_server: LiveServer) -> anthropic.Anthropic:
    # A timeout of our own: the SDK refuses large non-streamed max_tokens under its default one.
    return anthropic.Anthropic(base_url=default_server.base_url, api_key="unused", max_retries=0, timeout=120)


def _text(msg: anthropic.types.Message) -> str:
    return "".join(b.text for b in msg.content if b.type == "text")


def test_create_stream_and_count_tokens_agree(client: anthropic.Anthropic) -> None:
    # This SDK has no sampling arguments; extra_body carries them, as for any server-specific field.
    body = {"model": "smollm2", "max_tokens": 24, "system": "Answer in one sentence.", "messages": QUESTION,
            "extra_body": {"temperature": 0}}
    msg = client.messages.create(**body)  # type: ignore[call-overload]
    assert "Paris" in _text(msg) and msg.stop_reason in ("end_turn", "max_tokens")
    assert msg.usage.input_tokens > 10 and 0 < msg.usage.output_tokens <= 24
    with client.messages.stream(**body) as stream:  # the SDK's own parser reads every event
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == _text(msg) == _text(final)
    assert (final.stop_reason, final.usage.output_tokens) == (msg.stop_reason, msg.usage.output_tokens)
    count = client.messages.count_tokens(model="smollm2", system=body["system"], messages=QUESTION)

    def prompt(u: anthropic.types.Usage) -> int:
        # Anthropic's convention: input_tokens excludes what the prompt cache served (cache_read_input_tokens).
        return u.input_tokens + (u.cache_read_input_tokens or 0)

    assert count.input_tokens == prompt(msg.usage) == prompt(final.usage)
    assert (final.usage.cache_read_input_tokens or 0) > 0  # the same body again: served from the prompt cache


def test_stop_sequence_and_max_tokens(client: anthropic.Anthropic) -> None:
    msg = client.messages.create(model="smollm2", max_tokens=4, messages=QUESTION, extra_body=GREEDY)
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 4
    msg = client.messages.create(model="smollm2", max_tokens=24, messages=QUESTION, extra_body=GREEDY,
                                 stop_sequences=["France"])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "France"
    assert "France" not in _text(msg)


def test_errors_are_the_sdk_typed_exceptions(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as nf:
        client.messages.create(model="claude-unknown-model", max_tokens=8, messages=QUESTION)
    assert "smollm2" in str(nf.value.body)
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
        client.messages.create(model="smollm2", max_tokens=100_000, messages=QUESTION)
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="smollm2", max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    # the SDK's message (2.x) no longer quotes the body: the code is read from it
    assert isinstance(bad.value.body, dict) and bad.value.body["error"]["code"] == "unsupported_feature"
