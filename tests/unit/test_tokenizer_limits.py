"""What the server's long-input guard relies on in GGUFTokenizer, on both real test models:

- a long text goes through `encode_batch` (which releases the GIL) and gives exactly `encode`'s ids;
- no text tokenizes to fewer than len(text) / max_token_chars tokens, including a run of the longest token.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gmlx_plan.gguf_header import read_header
from gmlx_server.engine.tokenizer import GGUFTokenizer
from tests.conftest import gemma_path, smollm2_path

_TOKENIZERS: dict[str, GGUFTokenizer] = {}
_PIECES = [*"ab xy\n\t19<|>_éü中🙂", "<|im_start|>", "<start_of_turn>", "    ", "hello", " world"]
_TEXT = st.lists(st.sampled_from(_PIECES), max_size=1500).map("".join)  # most are past the encode_batch switch


def _tokenizer(which: str) -> GGUFTokenizer:
    if which not in _TOKENIZERS:
        path = smollm2_path() if which == "smollm2" else gemma_path()
        _TOKENIZERS[which] = GGUFTokenizer.from_metadata(read_header(path).metadata)
    return _TOKENIZERS[which]


@pytest.fixture(params=["smollm2", "gemma"])
def tok(request: Any) -> GGUFTokenizer:
    return _tokenizer(request.param)


def test_the_bound_is_the_longest_piece(tok: GGUFTokenizer) -> None:
    assert tok.max_token_chars is not None
    longest = max(range(tok.vocab_size), key=lambda i: len(tok.token_bytes(i)))
    # The spelling-based bound is never below what the longest token really covers.
    assert tok.max_token_chars >= len(tok.token_bytes(longest).decode("utf-8", errors="replace"))
    text = tok.decode([longest] * 400)
    assert len(tok.encode(text, False)) >= len(text) / tok.max_token_chars


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(text=_TEXT)
def test_long_texts_encode_like_encode_and_respect_the_bound(tok: GGUFTokenizer, text: str) -> None:
    ids = tok.encode(text, False)
    assert ids == tok.backend.encode(text, add_special_tokens=False).ids
    assert tok.max_token_chars is not None
    assert len(ids) * tok.max_token_chars >= len(text)
    with_special = tok.encode(text, True)
    assert with_special[len(with_special) - len(ids) - int(tok.add_eos):][:len(ids)] == ids


def test_no_bound_without_byte_fallback() -> None:
    """A SentencePiece vocabulary without its 256 byte tokens may fold any unknown run into one token."""
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "▁a", "a"],
            "tokenizer.ggml.token_type": [2, 3, 3, 1, 1], "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -1.0, -2.0],
            "tokenizer.ggml.unknown_token_id": 0}
    assert GGUFTokenizer.from_metadata(meta).max_token_chars is None
