"""Regex, choice, Lark and GBNF grammars through the official SDKs (extra_body) against a real `gmlx serve` running
SmolLM2: every spelling (response_format, vLLM's structured_outputs, llama-server's grammar), streamed and not,
on chat, messages, responses and completions; the output is held to the grammar in full.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.conftest import smollm2_path
from tests.e2e.server import LiveServer, gmlx_serve

pytestmark = pytest.mark.slow
ASK = [{"role": "user", "content": "Give me a phone number, or tell me if it will rain."}]
PHONE = "[0-9]{3}-[0-9]{4}"
CHOICES = ["sunny", "rainy", "cloudy with a chance of rain"]
LARK = 'start: ANSWER " because " WORD\nANSWER: "yes" | "no"\nWORD: /[a-z]{1,8}/'
LARK_RE = "(yes|no) because [a-z]{1,8}"
GBNF = 'root ::= "(" digit digit? ", " digit digit? ")"\ndigit ::= [0-9]'
GBNF_RE = r"\([0-9]{1,2}, [0-9]{1,2}\)"
FORMATS = [  # (extra_body, what the whole reply must match)
    ({"response_format": {"type": "regex", "regex": PHONE}}, PHONE),
    ({"structured_outputs": {"regex": PHONE}}, PHONE),
    ({"structured_outputs": {"choice": CHOICES}}, "|".join(map(re.escape, CHOICES))),
    ({"response_format": {"type": "choice", "choice": CHOICES}}, "|".join(map(re.escape, CHOICES))),
    ({"response_format": {"type": "grammar", "grammar": LARK}}, LARK_RE),
    ({"structured_outputs": {"grammar": GBNF}}, GBNF_RE),
    ({"grammar": GBNF}, GBNF_RE),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("serve")
    config = tmp / "gmlx.yaml"
    config.write_text(f"models:\n  smollm2:\n    path: {smollm2_path()}\n")
    with gmlx_serve(["--config", str(config)], tmp) as s:
        yield s


def _chat(oai: openai.OpenAI, extra: dict[str, Any], stream: bool) -> tuple[str, str | None]:
    kw: dict[str, Any] = {"model": "smollm2", "messages": ASK, "max_tokens": 24, "temperature": 0.7, "seed": 5,
                          "extra_body": extra}
    if not stream:
        r = oai.chat.completions.create(**kw)
        return r.choices[0].message.content or "", r.choices[0].finish_reason
    text, finish = "", None
    for chunk in oai.chat.completions.create(**kw, stream=True):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("extra", "pattern"), FORMATS)
def test_chat_output_is_held_to_the_grammar(oai: openai.OpenAI, extra: dict[str, Any], pattern: str,
                                            stream: bool) -> None:
    text, finish = _chat(oai, extra, stream)
    assert re.fullmatch(pattern, text), text
    assert finish == "stop"  # the grammar completed and the engine stopped there


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_messages_take_the_aliases(claude: anthropic.Anthropic, stream: bool) -> None:
    kw: dict[str, Any] = {"model": "smollm2", "max_tokens": 24, "messages": ASK,
                          "extra_body": {"structured_outputs": {"regex": PHONE}, "temperature": 0.7}}
    if stream:
        with claude.messages.stream(**kw) as s:
            text = "".join(s.text_stream)
    else:
        msg = claude.messages.create(**kw)
        text = "".join(b.text for b in msg.content if b.type == "text")
        assert msg.stop_reason == "end_turn"
    assert re.fullmatch(PHONE, text), text
    msg = claude.messages.create(model="smollm2", max_tokens=24, messages=ASK,  # type: ignore[arg-type]
                                 extra_body={"grammar": GBNF})
    assert re.fullmatch(GBNF_RE, "".join(b.text for b in msg.content if b.type == "text"))


def test_responses_and_completions_take_grammars(oai: openai.OpenAI) -> None:
    r = oai.responses.create(model="smollm2", input="Will it rain?", max_output_tokens=24,
                             extra_body={"text": {"format": {"type": "choice", "choice": CHOICES}}})
    assert r.output_text in CHOICES
    c = oai.completions.create(model="smollm2", prompt="Call me at", max_tokens=24, extra_body={"grammar": GBNF})
    assert re.fullmatch(GBNF_RE, c.choices[0].text), c.choices[0].text


@pytest.mark.parametrize(("extra", "param"), [
    ({"response_format": {"type": "regex", "regex": "[0-9"}}, "response_format.regex"),
    ({"structured_outputs": {"grammar": "start: missing_rule"}}, "structured_outputs.grammar"),
    ({"grammar": 'root ::= "unclosed'}, "grammar"),
    ({"structured_outputs": {"regex": "a"}, "grammar": GBNF}, "grammar"),
])
def test_a_malformed_grammar_is_a_typed_400_before_generation(oai: openai.OpenAI, claude: anthropic.Anthropic,
                                                               server: LiveServer, extra: dict[str, Any],
                                                               param: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="smollm2", messages=ASK, max_tokens=8, extra_body=extra)  # type: ignore[arg-type]
    assert (e.value.body["type"], e.value.body["param"]) == ("invalid_request_error", param)  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(model="smollm2", max_tokens=8, messages=ASK, extra_body=extra)  # type: ignore[arg-type]
    assert param in err.value.message
