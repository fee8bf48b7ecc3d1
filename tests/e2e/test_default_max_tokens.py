"""The default output cap on a real `gmlx serve` with SmolLM2: a request that names no cap (aider's chat
completions, a Codex Responses turn, an Anthropic body without max_tokens, a raw completion) ends at the
model's `default_max_tokens`, else the server's, instead of running to the window; /v1/models shows the cap.
Where the prompt leaves less than twice that, the cap is half of what it leaves: the conversation keeps room.
Greedy counting to five hundred runs past either cap, so each reply ends by the cap, not by the model."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from gmlx_server.config.settings import DEFAULT_MAX_TOKENS
from tests.conftest import smollm2_path
from tests.e2e.server import LiveServer, serve_config

pytestmark = pytest.mark.slow
SERVER_CAP, MODEL_CAP = 40, 24
SMALL_WINDOW = 96  # smollm2-small: COUNT's prompt (about 40 tokens) leaves it less than twice SERVER_CAP
COUNT = "Count from one to five hundred in words, separated by commas. Do not stop early."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with serve_config(tmp_path_factory.mktemp("defcap"),
                      f"server:\n  default_max_tokens: {SERVER_CAP}\n"
                      f"models:\n  smollm2:\n    path: {smollm2_path()}\n"
                      f"  smollm2-short:\n    path: {smollm2_path()}\n    default_max_tokens: {MODEL_CAP}\n"
                      f"  smollm2-small:\n    path: {smollm2_path()}\n    max_kv_size: {SMALL_WINDOW}\n") as s:
        yield s


def test_models_show_each_default_cap(server: LiveServer) -> None:
    rows = {r["id"]: r for r in httpx.get(server.v1 + "/models", timeout=30).json()["data"]}
    assert (rows["smollm2"]["default_max_tokens"], rows["smollm2-short"]["default_max_tokens"]) == (
        SERVER_CAP, MODEL_CAP)
    assert rows["smollm2"]["context_length"] > max(SERVER_CAP, DEFAULT_MAX_TOKENS)


def test_an_aider_like_chat_without_max_tokens_ends_at_the_cap(oai: openai.OpenAI) -> None:
    r = oai.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": COUNT}], temperature=0)
    assert r.usage is not None and (r.choices[0].finish_reason, r.usage.completion_tokens) == ("length", SERVER_CAP)
    short = oai.chat.completions.create(model="smollm2-short", messages=[{"role": "user", "content": COUNT}],
                                        temperature=0)
    assert short.usage is not None
    assert (short.choices[0].finish_reason, short.usage.completion_tokens) == ("length", MODEL_CAP)


def test_a_codex_like_responses_turn_without_a_cap_ends_at_it(oai: openai.OpenAI) -> None:
    r = oai.responses.create(model="smollm2", input=COUNT, temperature=0)
    assert r.usage is not None and r.usage.output_tokens == SERVER_CAP
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"


def test_an_anthropic_body_without_max_tokens_ends_at_the_models_cap(claude: anthropic.Anthropic) -> None:
    # messages.create requires max_tokens; the SDK's own post sends the body a looser client would
    r = claude.post("/v1/messages", cast_to=anthropic.types.Message, body={
        "model": "smollm2-short", "messages": [{"role": "user", "content": COUNT}], "temperature": 0})
    assert (r.stop_reason, r.usage.output_tokens) == ("max_tokens", MODEL_CAP)


def test_a_raw_completion_that_would_run_on_stops_at_the_cap(server: LiveServer) -> None:
    body = httpx.post(server.v1 + "/completions", timeout=300, json={
        "model": "smollm2", "prompt": "1, 2, 3, 4, 5,", "temperature": 0}).json()
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == SERVER_CAP
    explicit = httpx.post(server.v1 + "/completions", timeout=300, json={
        "model": "smollm2", "prompt": "1, 2, 3, 4, 5,", "temperature": 0, "max_tokens": SERVER_CAP + 8}).json()
    assert explicit["usage"]["completion_tokens"] == SERVER_CAP + 8  # a cap the request names wins


def test_a_cap_less_turn_leaves_the_conversation_half_the_room(oai: openai.OpenAI) -> None:
    r = oai.chat.completions.create(model="smollm2-small", messages=[{"role": "user", "content": COUNT}],
                                    temperature=0)
    assert r.usage is not None and r.choices[0].finish_reason == "length"
    room = SMALL_WINDOW - r.usage.prompt_tokens
    assert r.usage.completion_tokens == room // 2 < SERVER_CAP
