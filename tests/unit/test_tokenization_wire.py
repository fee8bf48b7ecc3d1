"""The tokenizer routes' converters (protocol.tokenization_wire): llama-server's and vLLM's bodies in, both
peers' fields out, and a typed 400 naming the field for every body neither would accept."""

from __future__ import annotations

from typing import Any

import pytest

from gmlx_server.errors import InvalidRequest, UnsupportedFeature
from gmlx_server.protocol.tokenization_wire import (
    MAX_TOKEN_IDS,
    parse_apply_template,
    parse_detokenize,
    parse_tokenize,
    piece,
    tokenize_answer,
)

HI = [{"role": "user", "content": "hi"}]


def test_llama_server_content_adds_no_special_tokens_by_default() -> None:
    r = parse_tokenize({"model": "m", "content": "Hello", "with_pieces": True})
    assert (r.params.model, r.params.prompt, r.add_special, r.with_pieces, r.text_param) == \
        ("m", "Hello", False, True, "content")


def test_vllm_prompt_adds_special_tokens_by_default_and_either_spelling_turns_them_off() -> None:
    assert parse_tokenize({"prompt": "Hello"}).add_special is True
    assert parse_tokenize({"prompt": "Hello", "add_special_tokens": False}).add_special is False
    assert parse_tokenize({"prompt": "Hello", "add_special": False}).add_special is False


def test_messages_are_a_chat_prompt_closed_by_the_generation_prompt_unless_asked() -> None:
    r = parse_tokenize({"messages": HI, "chat_template_kwargs": {"x": 1}, "return_token_strs": True})
    assert r.params.prompt is None and r.params.messages[0]["content"] == "hi"
    assert r.params.template_kwargs == {"x": 1} and r.params.add_generation_prompt and r.wants_pieces
    assert r.text_param == "messages" and r.add_special is False
    assert parse_apply_template({"messages": HI, "add_generation_prompt": False}).add_generation_prompt is False


# Each body and the field its 400 must name.
BAD_TOKENIZE: list[tuple[dict[str, Any], str]] = [
    ({}, "content"),
    ({"content": 5}, "content"),
    ({"prompt": ["a"]}, "prompt"),
    ({"content": "a", "prompt": "b"}, "prompt"),
    ({"messages": HI, "content": "a"}, "content"),
    ({"content": "a", "tools": []}, "tools"),
    ({"content": "a", "add_generation_prompt": True}, "add_generation_prompt"),
    ({"content": "a", "add_special": True, "add_special_tokens": False}, "add_special_tokens"),
    ({"content": "a", "with_pieces": "yes"}, "with_pieces"),
    ({"messages": "hi"}, "messages"),
]


@pytest.mark.parametrize(("body", "param"), BAD_TOKENIZE)
def test_a_tokenize_body_neither_peer_accepts_is_a_400_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_tokenize(body)
    assert e.value.param == param


@pytest.mark.parametrize(("body", "param"), [({"content": "a", "parse_special": False}, "parse_special"),
                                              ({"messages": HI, "continue_final_message": True},
                                               "continue_final_message"),
                                              ({"messages": HI, "chat_template": "{{ x }}"}, "chat_template")])
def test_a_peer_option_this_server_cannot_honour_is_refused_by_name(body: dict[str, Any], param: str) -> None:
    with pytest.raises(UnsupportedFeature) as e:
        parse_tokenize(body)
    assert e.value.param == param


def test_detokenize_reads_ids_and_names_the_first_bad_one() -> None:
    assert parse_detokenize({"model": "m", "tokens": [0, 5, 7]}).tokens == (0, 5, 7)
    for tokens, param in (("1 2", "tokens"), (None, "tokens"), ([1, True], "tokens[1]"), ([1, -3], "tokens[1]"),
                          ([1.5], "tokens[0]"), ([0] * (MAX_TOKEN_IDS + 1), "tokens")):
        with pytest.raises(InvalidRequest) as e:
            parse_detokenize({"tokens": tokens})
        assert e.value.param == param


def test_the_answer_carries_both_peers_fields() -> None:
    req = parse_tokenize({"content": "ab", "with_pieces": True, "return_token_strs": True})
    out = tokenize_answer(req, "m", [7, 8], [b"a", b"\xe2\x82"], 8192)
    assert out == {"model": "m", "tokens": [{"id": 7, "piece": "a"}, {"id": 8, "piece": [0xE2, 0x82]}],
                   "count": 2, "max_model_len": 8192, "n_ctx": 8192, "token_strs": ["a", "\ufffd"]}
    assert tokenize_answer(parse_tokenize({"prompt": "ab"}), "m", [7, 8], [], 10)["tokens"] == [7, 8]


def test_a_piece_is_text_when_it_is_utf8_and_its_bytes_when_not() -> None:
    assert piece("é".encode()) == "é" and piece(b"\xff") == [255]
