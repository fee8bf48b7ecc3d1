"""A real `gmlx serve` whose SmolLM2 drafts for itself (the packed layout for the dense one), through the
official SDKs: the /v1/models marker, the structured-request and logits-processor refusals on all three
protocols, and the drafter's counts in /v1/metrics and Prometheus after a plain request.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import smollm2_path
from tests.e2e.server import LiveServer, gmlx_serve

pytestmark = pytest.mark.slow
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
HI: Any = [{"role": "user", "content": "Name a city."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("serve")
    config = tmp / "gmlx.yaml"
    config.write_text(f"server:\n  decode_batch: 1\nmodels:\n  smol:\n    path: {smollm2_path()}\n    weights: dense\n"
                      f"    draft: smol-packed\n    draft_tokens: 3\n"
                      f"  smol-packed:\n    path: {smollm2_path()}\n    weights: packed\n"
                      f"  smol-dense:\n    path: {smollm2_path()}\n    weights: dense\n"
                      f"  smol-self:\n    path: {smollm2_path()}\n    draft: {smollm2_path()}\n")
    with gmlx_serve(["--config", str(config)], tmp) as s:
        yield s


def _clients(server: LiveServer) -> tuple[openai.OpenAI, anthropic.Anthropic]:
    return (openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0),
            anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0))


def test_the_models_marker(server: LiveServer) -> None:
    rows = {m["id"]: m for m in httpx.get(server.v1 + "/models", timeout=30).json()["data"]}
    assert rows["smol"]["speculative"] == {"draft": "smol-packed", "draft_tokens": 3, "verdict": "speculative",
                                           "verdict_batched": "plain"}
    assert rows["smol-packed"]["speculative"] is False


def _refused(call: Any, error: type[openai.APIStatusError] | type[anthropic.APIStatusError]) -> Any:
    with pytest.raises(error) as e:
        call()
    err: Any = e.value
    assert err.status_code == 400 and "speculative drafter" in str(err)
    return err


def test_structured_output_and_logits_processors_are_refused(server: LiveServer) -> None:
    oai, ant = _clients(server)
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}}
    err = _refused(lambda: oai.chat.completions.create(model="smol", messages=HI, response_format=fmt),
                   openai.BadRequestError)
    assert err.body["param"] == "response_format" and err.body["type"] == "unsupported_feature"
    text: Any = {"format": {"type": "json_schema", "name": "place", "schema": SCHEMA}}
    err = _refused(lambda: oai.responses.create(model="smol", input="Name a city.", text=text), openai.BadRequestError)
    assert err.body["param"] == "text.format"
    _refused(lambda: ant.messages.create(model="smol", max_tokens=8, messages=HI, extra_body={
        "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}), anthropic.BadRequestError)
    err = _refused(lambda: oai.chat.completions.create(model="smol", messages=HI, logit_bias={"5": 2}),
                   openai.BadRequestError)
    assert err.body["param"] == "logit_bias"


def test_a_plain_request_counts_its_rounds(server: LiveServer) -> None:
    oai, _ = _clients(server)
    out = oai.chat.completions.create(model="smol", messages=HI, max_tokens=12, temperature=0)
    assert out.choices[0].message.content
    metrics = httpx.get(server.v1 + "/metrics", timeout=30).json()["server"]
    spec = {m["id"]: m["speculative"] for m in metrics["resident_models"]}["smol"]
    assert spec["rounds"] > 0 and spec["drafted"] >= spec["accepted"] >= 0
    text = httpx.get(server.v1 + "/metrics", params={"format": "prometheus"}, timeout=30).text
    assert f'gmlx_speculative_rounds_total{{model="smol"}} {float(spec["rounds"])}' in text


PROMPTS = ["Write a haiku about rain.", "What is 12 times 7? Explain."]


@pytest.mark.parametrize(("target", "plain"), [("smol", "smol-dense"), ("smol-self", "smol-packed")],
                         ids=["packed-drafts-for-dense", "drafts-for-itself"])
def test_greedy_text_equals_decoding_without_a_drafter(server: LiveServer, target: str, plain: str) -> None:
    oai, _ = _clients(server)
    for prompt in PROMPTS:
        msgs: Any = [{"role": "user", "content": prompt}]
        with_draft = oai.chat.completions.create(model=target, messages=msgs, max_tokens=24, temperature=0)
        without = oai.chat.completions.create(model=plain, messages=msgs, max_tokens=24, temperature=0)
        assert with_draft.choices[0].message.content == without.choices[0].message.content
        assert with_draft.usage is not None and without.usage is not None
        assert with_draft.usage.completion_tokens == without.usage.completion_tokens
