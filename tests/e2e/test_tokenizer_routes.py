"""The tokenizer routes over real HTTP on a real `gmlx serve` with both architectures' models (SmolLM2, a llama,
and Gemma 3 270M), behind an API key: a chat prompt's count equals the Anthropic SDK's count_tokens and
/v1/estimate's prompt_tokens, text round-trips through /detokenize, /apply-template's prompt tokenizes to the
same ids, and each bad body is a typed 400 naming its field. The tokenizer routes load no model to answer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import gemma_path, smollm2_path
from tests.e2e.server import LiveServer, anthropic_client, gmlx_serve

pytestmark = pytest.mark.slow
KEY = "tok-secret"
MODELS = ("smollm2", "gemma")
TALK = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And times 3?"}]
TEXT = "Tokenizers split text: héllo wörld, 12345 🙂."
GEMMA_BOS = 2


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("tokenizer")
    cfg = tmp / "gmlx.yaml"
    cfg.write_text(f"server: {{api_key: {KEY}}}\n"
                   f"models:\n  smollm2: {{path: {smollm2_path()}}}\n  gemma: {{path: {gemma_path()}}}\n"
                   "services:\n  rerank: {method: llm, model: smollm2}\n")
    with gmlx_serve(["--config", str(cfg)], tmp, env={"GMLX_MAX_BODY_BYTES": "200000"}) as s:
        yield s


def post(server: LiveServer, path: str, body: dict[str, Any], key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server.base_url + path, json=body, headers=headers, timeout=120)


def ok(server: LiveServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = post(server, path, body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


@pytest.mark.parametrize("model", MODELS)
def test_a_chat_prompt_counts_as_count_tokens_and_estimate_count_it(server: LiveServer, model: str) -> None:
    tokens = ok(server, "/tokenize", {"model": model, "messages": TALK})
    v1 = ok(server, "/v1/tokenize", {"model": model, "messages": TALK})
    estimate = ok(server, "/v1/estimate", {"model": model, "messages": TALK})
    assert not estimate["resident"]  # the tokenizer routes (and estimate) loaded nothing; count_tokens loads
    anthropic = anthropic_client(server, api_key=KEY).messages.count_tokens(model=model, messages=TALK)  # type: ignore[arg-type]
    assert tokens["count"] == len(tokens["tokens"]) == v1["count"] == anthropic.input_tokens
    assert tokens["count"] == estimate["prompt_tokens"] > 10
    assert tokens["max_model_len"] == tokens["n_ctx"] == estimate["context_limit"]


@pytest.mark.parametrize("model", MODELS)
def test_text_round_trips_through_its_pieces_and_detokenize(server: LiveServer, model: str) -> None:
    split = ok(server, "/tokenize", {"model": model, "content": TEXT, "with_pieces": True})
    ids = [t["id"] for t in split["tokens"]]
    pieces = b"".join(t["piece"].encode() if isinstance(t["piece"], str) else bytes(t["piece"])
                      for t in split["tokens"])
    assert pieces.decode() == TEXT and split["count"] == len(ids) > 5
    for path in ("/detokenize", "/v1/detokenize"):
        back = ok(server, path, {"model": model, "tokens": ids})
        assert back["content"] == back["prompt"] == TEXT


def test_vllm_prompt_adds_the_bos_llama_server_content_does_not(server: LiveServer) -> None:
    plain = ok(server, "/tokenize", {"model": "gemma", "content": TEXT})["tokens"]
    vllm = ok(server, "/v1/tokenize", {"model": "gemma", "prompt": TEXT, "return_token_strs": True})
    assert vllm["tokens"] == [GEMMA_BOS, *plain] and vllm["token_strs"][0] == "<bos>"
    off = ok(server, "/v1/tokenize", {"model": "gemma", "prompt": TEXT, "add_special_tokens": False})
    assert off["tokens"] == plain


@pytest.mark.parametrize("model", MODELS)
def test_the_applied_template_tokenizes_to_the_chat_prompt(server: LiveServer, model: str) -> None:
    prompt = ok(server, "/apply-template", {"model": model, "messages": TALK})["prompt"]
    assert "And times 3?" in prompt
    as_text = ok(server, "/tokenize", {"model": model, "content": prompt})
    assert as_text["tokens"] == ok(server, "/tokenize", {"model": model, "messages": TALK})["tokens"]
    closed = ok(server, "/v1/apply-template", {"model": model, "messages": TALK, "add_generation_prompt": False})
    assert prompt.startswith(closed["prompt"]) and len(closed["prompt"]) < len(prompt)


def test_tools_are_written_into_the_rendered_prompt(server: LiveServer) -> None:
    tool = {"type": "function", "function": {"name": "lookup_capital", "description": "The capital of a country",
                                             "parameters": {"type": "object", "properties": {
                                                 "country": {"type": "string"}}}}}
    bare = ok(server, "/apply-template", {"model": "smollm2", "messages": TALK})["prompt"]
    with_tools = ok(server, "/apply-template", {"model": "smollm2", "messages": TALK, "tools": [tool]})["prompt"]
    assert "lookup_capital" in with_tools and "lookup_capital" not in bare


# A bad body, its status, and the error's code and param.
BAD: list[tuple[str, dict[str, Any], int, str, str | None]] = [
    ("/detokenize", {"model": "smollm2", "tokens": [1, 49152]}, 400, "invalid_token_id", "tokens[1]"),
    ("/v1/detokenize", {"model": "gemma", "tokens": [1, "2"]}, 400, "invalid_request_error", "tokens[1]"),
    ("/tokenize", {"model": "rerank", "content": "x"}, 400, "not_a_chat_model", "model"),
    ("/apply-template", {"model": "rerank", "messages": TALK}, 400, "not_a_chat_model", "model"),
    ("/tokenize", {"model": "nope", "content": "x"}, 404, "model_not_found", "model"),
    ("/tokenize", {"model": "gemma", "content": 7}, 400, "invalid_request_error", "content"),
    ("/v1/tokenize", {"model": "gemma", "prompt": "x", "tools": []}, 400, "invalid_request_error", "tools"),
    ("/apply-template", {"model": "gemma"}, 400, "invalid_request_error", "messages"),
    ("/tokenize", {"model": "gemma", "content": "x" * 300_000}, 413, "request_too_large", None),
]


@pytest.mark.parametrize(("path", "body", "status", "code", "param"), BAD)
def test_a_bad_body_is_a_typed_error_naming_its_field(server: LiveServer, path: str, body: dict[str, Any],
                                                      status: int, code: str, param: str | None) -> None:
    r = post(server, path, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error


def test_every_tokenizer_route_needs_the_key(server: LiveServer) -> None:
    for path in ("/tokenize", "/v1/tokenize", "/detokenize", "/v1/detokenize", "/apply-template",
                 "/v1/apply-template"):
        for key in (None, "wrong"):
            r = post(server, path, {"model": "smollm2", "messages": TALK, "tokens": [1]}, key)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", (path, r.text)
