"""A speculative model refuses request-level logits processors with a typed 400 that names the field and who
set it, on all three protocols (fake engines that claim a drafter); its rounds' own sampling passes, and a
model without a drafter takes everything."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gmlx_server.config import SAMPLING_KNOBS, Profile
from gmlx_server.engine.draft_policy import ROUND_SAMPLING
from tests.fakes import FakeFactory
from tests.routes.conftest import Served, make_config, serve

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def spec() -> Iterator[Served]:
    profiles = {"sticky": Profile("sticky", sampling={"frequency_penalty": 0.5})}
    s = serve(make_config(profiles=profiles), FakeFactory(drafts=True))
    yield s
    s.client.close()


def _openai_error(r: Any, param: str) -> str:
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "unsupported_feature" and err["param"] == param, r.text
    assert "speculative drafter" in err["message"]
    return str(err["message"])


@pytest.mark.parametrize("fmt", [{"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
                                 {"type": "json_object"}])
def test_structured_output_is_refused_on_chat(spec: Served, fmt: dict[str, Any]) -> None:
    message = _openai_error(spec.chat({"response_format": fmt}), "response_format")
    assert message.startswith("'response_format': structured output (response_format) needs a request-level logits "
                              "processor, a grammar")
    assert spec.engine().submitted == []


def test_structured_output_is_refused_on_responses_and_messages(spec: Served) -> None:
    r = spec.client.post("/v1/responses", json={"model": "m1", "input": "hi", "text": {"format": {
        "type": "json_schema", "name": "p", "schema": SCHEMA}}})
    _openai_error(r, "text.format")
    r = spec.client.post("/v1/messages", json={"model": "m1", "max_tokens": 8, "messages": HI, "output_config": {
        "format": {"type": "json_schema", "schema": SCHEMA}}})
    body = r.json()
    assert r.status_code == 400 and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "'output_config.format': structured output" in body["error"]["message"]
    assert "speculative drafter" in body["error"]["message"]
    assert spec.engine().submitted == []


@pytest.mark.parametrize("field, value", [("logit_bias", {"5": 2.0}), ("presence_penalty", 0.5),
                                          ("frequency_penalty", -0.2), ("repetition_penalty", 1.1),
                                          ("typical_p", 0.9), ("xtc_probability", 0.3), ("top_n_sigma", 1.0)])
def test_each_logits_processor_is_named(spec: Served, field: str, value: Any) -> None:
    message = _openai_error(spec.chat({field: value}), field)
    assert message.startswith(f"'{field}': {field} (set by the request) is a request-level logits processor")
    r = spec.client.post("/v1/messages", json={"model": "m1", "max_tokens": 8, "messages": HI, field: value})
    assert r.status_code == 400 and f"'{field}'" in r.json()["error"]["message"]


def test_a_profile_or_intent_that_sets_one_is_named(spec: Served) -> None:
    assert "(set by profile 'sticky')" in _openai_error(spec.chat({"model": "m1@sticky"}), "frequency_penalty")
    # The llama family's built-in creative intent carries repetition_penalty 1.05.
    assert "(set by profile 'creative')" in _openai_error(spec.chat({"model": "m1@creative"}), "repetition_penalty")


def test_what_a_round_honours_passes(spec: Served) -> None:
    assert ROUND_SAMPLING == ("temperature", "top_p", "top_k", "min_p", "seed")
    body = {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 3, "stop": ["x"],
            "presence_penalty": 0, "frequency_penalty": 0, "logprobs": True, "top_logprobs": 2}
    assert spec.chat(body).status_code == 200
    assert spec.chat({"model": "m1@coding"}).status_code == 200  # llama's coding intent: temperature and top_p
    r = spec.client.post("/v1/responses", json={"model": "m1", "input": "hi", "temperature": 0.2})
    assert r.status_code == 200
    assert len(spec.engine().submitted) == 3


# Knobs that only shape another knob (its look-back window, its threshold): on only when their master is.
MODIFIERS = {"repetition_context_size", "presence_context_size", "frequency_context_size", "xtc_threshold"}


def test_every_other_knob_is_refused_when_on(spec: Served) -> None:
    """A knob added to config/sampling.py is honoured by the round, or refused: never taken and ignored."""
    for name, knob in SAMPLING_KNOBS.items():
        if name in ROUND_SAMPLING or name in MODIFIERS:
            continue
        on = True if knob.kind == "boolean" else knob.hi / 2  # off values sit at the ends or at 0
        _openai_error(spec.chat({name: on}), name)


def test_a_model_without_a_drafter_takes_them() -> None:
    s = serve()
    try:
        assert s.chat({"logit_bias": {"5": 2.0}, "presence_penalty": 0.5, "response_format": {
            "type": "json_object"}}).status_code == 200
    finally:
        s.client.close()
