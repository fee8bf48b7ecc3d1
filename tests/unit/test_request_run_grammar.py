"""The engine's side of structured output, without a model: a RequestRun whose request carries a grammar
masks every draw, advances the grammar with every accepted token (sampled or forced) and stops with
"stop" as soon as the grammar is complete; a rejected forced token fails that request only."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import mlx.core as mx
import numpy as np
import pytest

from gmlx_server.engine.request_run import Progress, RequestRun
from gmlx_server.engine.sampling import RequestSampler
from gmlx_server.engine.structured import GrammarTokenizerCache, json_grammar
from gmlx_server.engine.types import GenerationRequest, SamplingParams, TokenEvent
from tests.unit.test_structured import SCHEMA, FakeVocab


class Tokenizer(FakeVocab):
    """FakeVocab plus what the engine's detokenizer and sampler read."""

    strip_leading_space = False


class Cache:
    state: tuple[Any, ...] = ()  # what prefill evaluates between chunks


class Out:
    def __init__(self, logits: mx.array) -> None:
        self.logits = logits


class RandomModel:
    """Seeded random logits over the padded vocabulary, one row per input position."""

    def __init__(self, width: int, seed: int) -> None:
        self.width, self.rng = width, np.random.default_rng(seed)

    def make_cache(self) -> list[Cache]:
        return [Cache()]

    def __call__(self, ids: mx.array, cache: Any = None) -> Out:
        shape = (*ids.shape, self.width)
        return Out(mx.array(self.rng.standard_normal(shape).astype(np.float32) * 3))


def _run(schema: dict[str, Any], seed: int, temperature: float = 0.0, max_tokens: int = 200,
         forced: dict[int, int] | None = None) -> list[TokenEvent]:
    """Prefill, then draw/accept one token at a time, as BatchDecoder.step does for each row."""
    vocab, events = Tokenizer(), list[TokenEvent]()
    grammar = json_grammar(schema)
    request = GenerationRequest("r", [1, 2, 3], max_tokens, SamplingParams(temperature, seed=seed), grammar=grammar)
    cache = GrammarTokenizerCache()
    seq = RequestRun(RandomModel(vocab.padded, seed), vocab, request, events.append, lambda: False, Progress(),
                   grammar_tokenizer=lambda: cache.get(vocab, vocab.padded))
    done, step = seq.prefill_step(), 0
    while not done:
        step += 1
        token = (forced or {}).get(step)
        logits = seq.model(mx.array([[seq.next_input]])).logits[:, -1, :]
        done = seq.accept(None if token is not None else seq.draw(logits), token)
    return events


@pytest.mark.parametrize("seed, temperature", [(0, 0.0), (1, 0.0), (2, 1.0), (3, 1.5)])
def test_every_output_is_valid_and_ends_when_the_grammar_does(seed: int, temperature: float) -> None:
    events = _run(SCHEMA, seed, temperature)
    final = events[-1]
    assert final.finish_reason == "stop" and final.error is None
    text = "".join(e.text for e in events)
    jsonschema.validate(json.loads(text), SCHEMA)
    assert final.token_id != 256  # stopped on the grammar's last token, not on a sampled EOS


def test_the_output_cap_still_wins_over_an_unfinished_grammar() -> None:
    events = _run({"type": "object"}, seed=0, max_tokens=3)
    assert events[-1].finish_reason == "length" and len([e for e in events if e.token_id is not None]) == 3


def test_a_forced_token_the_grammar_rejects_fails_this_request_only() -> None:
    events = _run({"enum": ["ab"]}, seed=0, forced={1: ord("z")})
    assert events[-1].finish_reason == "error" and "rejected" in (events[-1].error or "")


def test_a_forced_token_the_grammar_allows_advances_it() -> None:
    events = _run({"enum": ["abc"]}, seed=0, forced={1: ord("a")})  # prefill drew '"'; step 1 forces 'a'
    assert "".join(e.text for e in events) == '"abc"' and events[-1].finish_reason == "stop"


def test_the_constraint_runs_after_the_penalties_and_they_keep_their_history() -> None:
    sampler = RequestSampler(SamplingParams(0.0, repetition_penalty=1.3), [])
    seen: list[int] = []
    sampler.constrain(lambda history, logits: (seen.append(history.size), logits)[1])
    assert sampler.needs_history  # the penalty needs it; the constraint alone would not
    sampler(mx.zeros((1, 8)), mx.array([1, 2, 3]))
    assert seen == [3]
    alone = RequestSampler(SamplingParams(0.0), [])
    alone.constrain(lambda history, logits: logits)
    assert not alone.needs_history

