"""The GGUF tokenizer holds its vocabulary once, in the HF backend, yet answers for pieces and ids exactly as
the file's token list does (respelled pieces, a piece listed twice), and keeps no Python copy of it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from gmlx_plan.gguf_header import read_header
from gmlx_server.engine.tokenizer import GGUFTokenizer
from tests.conftest import gemma_path, smollm2_path


@pytest.fixture(scope="module", params=[smollm2_path, gemma_path], ids=["smollm2", "gemma3"])
def model(request: pytest.FixtureRequest) -> tuple[list[str], GGUFTokenizer]:
    path: Callable[[], str] = request.param
    metadata = read_header(path()).metadata
    return metadata["tokenizer.ggml.tokens"], GGUFTokenizer.from_metadata(metadata)


def test_every_id_and_piece_answers_as_the_token_list(model: tuple[list[str], GGUFTokenizer]) -> None:
    tokens, tok = model
    assert tok.vocab_size == len(tokens)
    assert [tok.id_to_piece(i) for i in range(len(tokens))] == tokens
    last = {t: i for i, t in enumerate(tokens)}
    assert [tok.token_to_id(t) for t in last] == list(last.values())
    assert tok.token_to_id("not a piece of any vocabulary") is None
    with pytest.raises(IndexError):
        tok.id_to_piece(len(tokens))


def test_the_tokenizer_keeps_no_python_copy_of_the_vocabulary(model: tuple[list[str], GGUFTokenizer]) -> None:
    """Beside its backend it holds the control and literal id sets and the few respelled pieces: under 8 bytes
    a piece, less than a list of the pieces' pointers alone (Gemma 3's list and id map were 42 MB)."""
    tokens, tok = model
    held = [v for k, v in vars(tok).items() if k != "backend"]
    size = sum(_deep_size(v) for v in held)
    assert size < 8 * len(tokens), f"{size / 1e6:.1f} MB of Python objects beside the backend"


def _deep_size(value: Any) -> int:
    """The container and what it holds, one level down (the pieces and ids it would keep alive)."""
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        return size + sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        return size + sum(map(sys.getsizeof, value))
    return size


def test_gemma_space_runs_answer_by_their_file_spelling() -> None:
    """Gemma's all-space pieces reach the BPE as '▁' runs: the file's spelling keeps the id; a '▁' run that
    is no piece of the file has none."""
    tokens = read_header(gemma_path()).metadata["tokenizer.ggml.tokens"]
    tok = GGUFTokenizer.from_metadata(read_header(gemma_path()).metadata)
    ids = {t: i for i, t in enumerate(tokens)}
    runs = [t for t in ids if t and not t.strip(" ")]
    assert runs
    for run in runs:
        assert tok.token_to_id(run) == ids[run] and tok.id_to_piece(ids[run]) == run
        assert tok.token_to_id("▁" * len(run)) == ids.get("▁" * len(run))


def test_a_piece_listed_twice_and_a_respelled_one() -> None:
    """A byte-level file: 'a' listed twice (its last id wins, as in llama.cpp's map), and a user-defined
    '€' the BPE holds respelled in the byte alphabet ('â‚¬'), which is no piece itself."""
    tok = GGUFTokenizer.from_metadata({
        "general.architecture": "llama", "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": ["a", "b", "ab", "a", "€"], "tokenizer.ggml.token_type": [1, 1, 1, 1, 4],
        "tokenizer.ggml.merges": ["a b"],
    })
    assert [tok.id_to_piece(i) for i in range(5)] == ["a", "b", "ab", "a", "€"]
    assert [tok.token_to_id(t) for t in ("a", "b", "ab", "€")] == [3, 1, 2, 4]
    assert tok.token_to_id("â\x82¬") is None
    assert tok.decode([0, 3, 4]) == "aa€"
