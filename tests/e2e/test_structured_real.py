"""Grammar-constrained decoding on the real SmolLM2: every output parses and validates against its schema.

Schemas come from hypothesis over a subset (objects, arrays, enums, bounded integers, booleans, nested
required fields), kept to those whose longest possible JSON text fits in MAX_TOKENS bytes: every token
is at least one byte and separators are fixed, so each constrained output finishes before the cap.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import jsonschema
import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, note, seed, settings
from hypothesis import strategies as st

from gmlx_server.engine.loader import LoadedModel, load_gguf_model
from gmlx_server.engine.sampling import RequestSampler
from gmlx_server.engine.structured import GrammarConstraint, GrammarTokenizerCache, json_grammar
from gmlx_server.engine.types import SamplingParams
from tests.conftest import smollm2_path

pytestmark = pytest.mark.slow
MAX_TOKENS = 48
log = logging.getLogger("tests.structured")


@pytest.fixture(scope="module")
def smol() -> Iterator[tuple[LoadedModel, GrammarTokenizerCache, int]]:
    loaded = load_gguf_model(smollm2_path(), "smollm2")
    width = int(loaded.model(mx.array([[1]]), cache=loaded.model.make_cache()).logits.shape[-1])
    cache = GrammarTokenizerCache()
    start = time.perf_counter()
    cache.get(loaded.tokenizer, width)  # the one-time build, measured here
    log.warning("llguidance tokenizer for SmolLM2 (%d tokens): %.2f s", width, time.perf_counter() - start)
    yield loaded, cache, width


# Schemas ------------------------------------------------------------------------------------------

KEYS = ["id", "ok", "city", "kind", "size", "tags"]
WORDS = ["red", "blue", "cat", "dog", "yes", "no"]

leaves = st.one_of(
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-20, 50), st.integers(0, 60)),
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=3, unique=True).map(lambda v: {"enum": v}),
    st.just({"type": "boolean"}),
)


@st.composite
def objects(draw: st.DrawFn, values: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    props = draw(st.dictionaries(st.sampled_from(KEYS), values, min_size=1, max_size=3))
    required = draw(st.lists(st.sampled_from(sorted(props)), unique=True))
    return {"type": "object", "properties": props, "required": sorted(required), "additionalProperties": False}


def arrays(items: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(lambda it, n: {"type": "array", "items": it, "maxItems": n}, items, st.integers(1, 2))


def longest_json(schema: dict[str, Any]) -> int:
    """Upper bound on the length of any compact JSON text (', ' and ': ' separators) the schema allows."""
    if "enum" in schema:
        return max(len(json.dumps(v)) for v in schema["enum"])
    kind = schema["type"]
    if kind == "integer":
        return max(len(str(schema["minimum"])), len(str(schema["maximum"])))
    if kind == "boolean":
        return 5
    if kind == "array":
        n = int(schema["maxItems"])
        return 2 + n * longest_json(schema["items"]) + 2 * (n - 1)
    props = schema["properties"]
    return 2 + sum(len(json.dumps(k)) + 2 + longest_json(v) for k, v in props.items()) + 2 * (len(props) - 1)


nested = st.recursive(leaves, lambda inner: st.one_of(arrays(inner), objects(inner)), max_leaves=4)
schemas = objects(nested).filter(lambda s: longest_json(s) < MAX_TOKENS)


# Decoding -----------------------------------------------------------------------------------------

def _prompt(loaded: LoadedModel, schema: dict[str, Any]) -> list[int]:
    ask = f"Reply with one JSON object that matches this JSON schema: {json.dumps(schema)}"
    rendered = loaded.template.render([{"role": "user", "content": ask}], add_generation_prompt=True)
    return loaded.tokenizer.encode(rendered, add_special_tokens=False)


def _constrained(loaded: LoadedModel, constraint: GrammarConstraint, prompt: list[int],
                 params: SamplingParams) -> tuple[list[int], bool]:
    """The engine's loop in small: processor before the sampler; stop at EOS or when the grammar is done."""
    sampler = RequestSampler(params, sorted(loaded.tokenizer.special_ids))
    cache = loaded.model.make_cache()
    logits = loaded.model(mx.array([prompt]), cache=cache).logits[:, -1, :]
    history, out = list(prompt), list[int]()
    for _ in range(MAX_TOKENS):
        token = int(np.array(sampler(constraint(mx.array(history), logits), None).token)[0])
        if token in loaded.tokenizer.eos_ids:
            return out, True
        out.append(token)
        history.append(token)
        constraint.consume(token)
        if constraint.is_finished:
            return out, True
        logits = loaded.model(mx.array([[token]]), cache=cache).logits[:, -1, :]
    return out, False


@seed(20240605)
@settings(max_examples=8, deadline=None, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                 HealthCheck.function_scoped_fixture])
@given(schema=schemas, temperature=st.sampled_from([0.0, 0.8]), sample_seed=st.integers(0, 2**16))
def test_constrained_outputs_parse_and_validate(
    smol: tuple[LoadedModel, GrammarTokenizerCache, int], schema: dict[str, Any], temperature: float,
    sample_seed: int,
) -> None:
    loaded, cache, width = smol
    compiled = json_grammar(schema)
    assert compiled is not None
    constraint = GrammarConstraint(compiled, cache.get(loaded.tokenizer, width))
    tokens, finished = _constrained(loaded, constraint, _prompt(loaded, schema),
                                    SamplingParams(temperature=temperature, seed=sample_seed))
    text = loaded.tokenizer.decode(tokens)
    note(f"schema={json.dumps(schema)} output={text!r}")
    log.info("T=%.1f %d tokens: %s -> %s", temperature, len(tokens), json.dumps(schema), text)
    assert finished, f"no end within {MAX_TOKENS} tokens although the longest text is {longest_json(schema)} bytes"
    assert constraint.is_accepting and constraint.error is None
    jsonschema.validate(json.loads(text), schema)


def test_json_object_mode_gives_an_object(smol: tuple[LoadedModel, GrammarTokenizerCache, int]) -> None:
    """The permissive grammar has no length bound: unfinished at the cap, the text is still a valid prefix."""
    loaded, cache, width = smol
    compiled = json_grammar({"type": "object"}, "json_object")
    assert compiled is not None
    constraint = GrammarConstraint(compiled, cache.get(loaded.tokenizer, width))
    prompt = _prompt(loaded, {"type": "object", "properties": {"city": {"type": "string"}}})
    tokens, finished = _constrained(loaded, constraint, prompt, SamplingParams(temperature=0.0))
    text = loaded.tokenizer.decode(tokens)
    assert text.startswith("{") and constraint.error is None
    if finished:
        assert isinstance(json.loads(text), dict)
