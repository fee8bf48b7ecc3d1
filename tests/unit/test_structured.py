"""Structured output: the portable mask, response_format checks, the tokenizer cache, constrained decoding."""

from __future__ import annotations

import gc
import json
import logging

import jsonschema
import mlx.core as mx
import numpy as np
import pytest

from gmlx_server.engine import structured
from gmlx_server.engine.structured import (
    GrammarConstraint,
    GrammarTokenizerCache,
    GrammarViolation,
    apply_token_bitmask,
    json_grammar,
    metal_mask_available,
)

EOS = 256
PIECES = [b'{"', b'": ', b'", "', b"true", b"false", b"null", b"  ", b"}}", b"\xc3\xa9"]  # some multi-byte tokens


class FakeVocab:
    """A tiny tokenizer: every byte, EOS, a few multi-byte pieces, and padded ids with no bytes."""

    def __init__(self, padded: int = 5) -> None:
        self.tokens = [bytes([b]) for b in range(256)] + [b"<eos>", *PIECES]
        self.vocab_size = len(self.tokens)
        self.padded = self.vocab_size + padded
        self.bos_id: int | None = None
        self.eos_ids = frozenset({EOS})
        self.special_ids = frozenset({EOS})

    def token_bytes(self, token_id: int) -> bytes:
        return self.tokens[token_id] if 0 <= token_id < self.vocab_size else b""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))


def _reference_mask(logits: np.ndarray, bitmask: np.ndarray) -> np.ndarray:
    """Plain numpy: bit j of 32-bit word w allows token 32*w + j."""
    words = bitmask.view(np.uint32)
    bits = (words[:, :, None] >> np.arange(32, dtype=np.uint32)) & 1
    allowed = bits.reshape(bitmask.shape[0], -1).astype(bool)
    vocab = logits.shape[-1]
    if allowed.shape[1] < vocab:
        allowed = np.pad(allowed, ((0, 0), (0, vocab - allowed.shape[1])))
    return np.where(allowed[:, :vocab], logits, -np.inf)


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 49152 + 7, 262144 - 5])
def test_portable_mask_matches_numpy_reference(vocab: int) -> None:
    rng = np.random.default_rng(vocab)
    words = (vocab + 31) // 32
    for density in (0.0, 0.02, 0.5, 1.0):
        bits = rng.random((1, words * 32)) < density
        bitmask = np.packbits(bits, axis=1, bitorder="little").view(np.int32)
        logits = rng.standard_normal((1, vocab)).astype(np.float32)
        got = np.array(apply_token_bitmask(mx.array(logits), bitmask))
        np.testing.assert_array_equal(got, _reference_mask(logits, bitmask))


def test_portable_mask_blocks_tokens_past_the_mask_and_keeps_dtype() -> None:
    rng = np.random.default_rng(0)
    bitmask = np.full((1, 2), -1, dtype=np.int32)  # 64 tokens allowed; the logits have 70
    logits = rng.standard_normal((1, 70)).astype(np.float32)
    got = apply_token_bitmask(mx.array(logits).astype(mx.bfloat16), bitmask)
    assert got.dtype == mx.bfloat16
    np.testing.assert_array_equal(np.isinf(np.array(got.astype(mx.float32)))[0], np.arange(70) >= 64)


def test_cpu_device_takes_the_portable_path() -> None:
    if mx.default_device() == mx.gpu and mx.metal.is_available():
        pytest.skip("Metal device: the kernel path is the right one here")
    assert not metal_mask_available()
    cache = GrammarTokenizerCache()
    compiled = json_grammar({"type": "object"}, "json_object")
    assert compiled is not None
    constraint = GrammarConstraint(compiled, cache.get(FakeVocab()))
    assert not constraint.uses_metal


# The tokenizer cache ------------------------------------------------------------------------------

def test_cache_builds_once_per_tokenizer_and_width(monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    builds: list[int] = []
    real = structured.build_llg_tokenizer

    def counting(tok: FakeVocab, n: int | None = None) -> object:
        builds.append(n or 0)
        return real(tok, n)

    monkeypatch.setattr(structured, "build_llg_tokenizer", counting)
    cache, vocab = GrammarTokenizerCache(), FakeVocab()
    with caplog.at_level(logging.INFO, logger="gmlx.engine"):
        first = cache.get(vocab)
        assert cache.get(vocab) is first
        wide = cache.get(vocab, vocab.padded)
    assert wide is not first and wide.vocab_size == vocab.padded and first.vocab_size == vocab.vocab_size
    assert builds == [vocab.vocab_size, vocab.padded]
    assert "llguidance tokenizer built in" in caplog.text
    other = FakeVocab()
    assert cache.get(other) is not first  # per tokenizer object, not per equal contents
    del vocab, other
    gc.collect()
    assert len(cache._built) == 0  # entries die with their tokenizer


# Constrained decoding on the byte vocabulary ------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def _decode(constraint: GrammarConstraint, vocab: FakeVocab, seed: int, explicit: bool) -> bytes:
    """Sample random logits through the constraint until EOS; `explicit` also calls consume() itself."""
    rng = np.random.default_rng(seed)
    history, out = [1, 2, 3], b""  # a fake prompt
    for _ in range(200):
        logits = mx.array(rng.standard_normal((1, vocab.padded)).astype(np.float32) * 3)
        masked = constraint(mx.array(history), logits)
        token = int(np.array(mx.argmax(masked, axis=-1))[0])
        if token == EOS:
            return out
        out += vocab.token_bytes(token)
        history.append(token)
        if explicit:
            constraint.consume(token)
    raise AssertionError(f"no EOS after 200 tokens: {out!r}")


@pytest.mark.parametrize(("seed", "explicit"), [(0, False), (1, True), (2, False), (3, True)])
def test_random_logits_through_the_constraint_give_valid_json(seed: int, explicit: bool) -> None:
    vocab = FakeVocab()
    compiled = json_grammar(SCHEMA)
    assert compiled is not None
    constraint = GrammarConstraint(compiled, GrammarTokenizerCache().get(vocab, vocab.padded))
    text = _decode(constraint, vocab, seed, explicit)
    jsonschema.validate(json.loads(text), SCHEMA)
    assert constraint.is_finished and constraint.is_accepting and constraint.error is None


def test_finished_grammar_allows_only_eos() -> None:
    vocab = FakeVocab()
    compiled = json_grammar({"enum": [7]})
    assert compiled is not None
    constraint = GrammarConstraint(compiled, GrammarTokenizerCache().get(vocab, vocab.padded))
    first = constraint(mx.array([1]), mx.zeros((vocab.padded,)))
    assert np.isfinite(np.array(first)).nonzero()[0].tolist() == [ord("7")]
    constraint.consume(ord("7"))
    assert constraint.is_finished
    after = constraint(mx.array([1, ord("7")]), mx.zeros((1, vocab.padded)))
    assert np.isfinite(np.array(after))[0].nonzero()[0].tolist() == [EOS]


def test_a_forbidden_token_is_a_grammar_violation() -> None:
    vocab = FakeVocab()
    compiled = json_grammar({"type": "object"}, "json_object")
    assert compiled is not None
    constraint = GrammarConstraint(compiled, GrammarTokenizerCache().get(vocab))
    constraint(mx.array([1]), mx.zeros((1, vocab.vocab_size)))
    with pytest.raises(GrammarViolation, match="rejected"):
        constraint.consume(ord("x"))


def test_history_is_required_after_the_first_token() -> None:
    vocab = FakeVocab()
    compiled = json_grammar({"type": "object"}, "json_object")
    assert compiled is not None
    constraint = GrammarConstraint(compiled, GrammarTokenizerCache().get(vocab))
    constraint(mx.array([], dtype=mx.int32), mx.zeros((1, vocab.vocab_size)))  # first call: nothing to consume
    with pytest.raises(GrammarViolation, match="needs the token history"):
        constraint(mx.array([], dtype=mx.int32), mx.zeros((1, vocab.vocab_size)))
