"""Grammar-constrained decoding with llguidance: JSON schemas, regexes, choices and Lark / GBNF grammars (and
tool calls, whose grammars engine/tool_grammar.py builds).

Three pieces, each owned by its caller:
- `json_grammar`, `regex_grammar`, `choice_grammar` and `lark_grammar` check an output format before
  generation (the service turns a StructuredOutputError into a 400 naming the field);
- `GrammarTokenizerCache` builds llguidance's view of a model's vocabulary once per tokenizer;
- `GrammarConstraint` is a per-request logits processor that masks every token the grammar forbids.

mlx-vlm applies the llguidance mask with a Metal kernel, which fails on a CPU device ("No Metal
back-end"); `apply_token_bitmask` does the same with portable MLX ops, and the Metal kernel is kept
where Metal is the default device.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import llguidance as llg
import llguidance.numpy as llg_numpy
import mlx.core as mx
import numpy as np

from gmlx_server.engine.types import CompiledGrammar

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # a TypedDict that exists only in the stub

    from gmlx_server.engine.types import Tokenizer

log = logging.getLogger("gmlx.engine")

# One-line JSON with readable separators (as mlx-vlm does): no whitespace runs for a small model to loop in.
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class StructuredOutputError(ValueError):
    """An output format that cannot be enforced (a malformed schema, regex or grammar)."""

    def __init__(self, message: str, param: str = "response_format") -> None:
        super().__init__(message)
        self.param = param


class GrammarViolation(RuntimeError):
    """The matcher rejected a token mid-generation (a bug or a processor that undid the mask)."""


def json_grammar(schema: Mapping[str, Any], kind: Literal["json_schema", "json_object"] = "json_schema",
                 ) -> CompiledGrammar:
    """A JSON schema held to; raises StructuredOutputError before any generation starts."""
    _check_draft(schema)
    try:
        grammar = llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_OPTIONS)
    except ValueError as e:
        raise StructuredOutputError(f"malformed JSON schema: {e}") from e
    return CompiledGrammar(kind, schema, _checked(grammar, "JSON schema cannot be enforced"))


def regex_grammar(pattern: str) -> CompiledGrammar:
    """The whole output matches `pattern` (Rust regex syntax, as llguidance reads it)."""
    return CompiledGrammar("regex", None, _checked(llg.LLMatcher.grammar_from_regex(pattern), "invalid regex"))


def choice_grammar(choices: Sequence[str]) -> CompiledGrammar:
    """The output is exactly one of `choices`."""
    return CompiledGrammar("choice", None, _checked(llg.grammar_from("choice", json.dumps(list(choices))),
                                                    "choices cannot be enforced"))


def lark_grammar(text: str) -> CompiledGrammar:
    """llguidance's Lark, or GBNF as llama-server takes it (converted to Lark first)."""
    try:
        grammar = llg.grammar_from("grammar", text)
    except ValueError as e:
        raise StructuredOutputError(f"invalid grammar: {first_line(str(e))}") from e
    return CompiledGrammar("grammar", None, _checked(grammar, "invalid grammar"))


def _check_draft(schema: Mapping[str, Any]) -> None:
    """The JSON Schema meta-schema check (jsonschema is optional: llguidance's own check still runs)."""
    try:
        from jsonschema import exceptions, validators
    except ImportError:
        return
    try:
        validators.validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as e:
        raise StructuredOutputError(f"malformed JSON schema: {e.message}") from e


def _checked(grammar: str, what: str) -> str:
    failed, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        raise StructuredOutputError(f"{what}: {first_line(messages[0])}")
    return grammar


class _VocabView:
    """The duck-typed tokenizer `llguidance.TokenizerWrapper` reads (tokens as bytes, an encode callback)."""

    def __init__(self, tokenizer: Tokenizer, n_vocab: int) -> None:
        # Weak, so that a cache entry (which holds this view) does not keep its own key alive.
        self._tokenizer = weakref.ref(tokenizer)
        eos = sorted(tokenizer.eos_ids)
        self.eos_token_id = eos[0] if eos else None
        self.bos_token_id = tokenizer.bos_id
        # Ids past the tokenizer (padded embedding rows) get no bytes: llguidance never allows them.
        self.tokens = [tokenizer.token_bytes(i) for i in range(n_vocab)]
        self.special_token_ids = sorted(tokenizer.special_ids)

    def __call__(self, text: bytes | str) -> list[int]:
        tokenizer = self._tokenizer()
        if tokenizer is None:
            raise RuntimeError("the tokenizer behind this llguidance tokenizer is gone")
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return tokenizer.encode(text, add_special_tokens=False)


def build_llg_tokenizer(tokenizer: Tokenizer, n_vocab: int | None = None) -> llg.LLTokenizer:
    """llguidance's tokenizer for a model whose logits have `n_vocab` columns (default: the vocabulary)."""
    n = max(n_vocab or 0, tokenizer.vocab_size)
    start = time.perf_counter()
    view = _VocabView(tokenizer, n)
    built = llg.LLTokenizer(llg.TokenizerWrapper(view), n_vocab=n, eos_token=sorted(tokenizer.eos_ids) or None)
    log.info("structured output: llguidance tokenizer built in %.2f s (%d tokens, eos %s)",
             time.perf_counter() - start, n, sorted(tokenizer.eos_ids))
    return built


class GrammarTokenizerCache:
    """llguidance tokenizers by tokenizer object (weakly) and logits width; one per engine is enough."""

    def __init__(self) -> None:
        self._built: weakref.WeakKeyDictionary[Tokenizer, dict[int, llg.LLTokenizer]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self, tokenizer: Tokenizer, n_vocab: int | None = None) -> llg.LLTokenizer:
        key = max(n_vocab or 0, tokenizer.vocab_size)
        with self._lock:  # a build takes ~0.5-1.5 s: two first requests must not both pay it
            by_width = self._built.setdefault(tokenizer, {})
            if key not in by_width:
                by_width[key] = build_llg_tokenizer(tokenizer, key)
            return by_width[key]


# A mask bit (0 or 1) -> what it adds to that token's logit.
_ADDEND = np.array([-np.inf, 0.0], dtype=np.float32)


def apply_token_bitmask(logits: mx.array, bitmask: np.ndarray) -> mx.array:
    """Portable: keep logits whose bit is set in llguidance's packed mask, -inf elsewhere.

    logits (B, V) float; bitmask (B, W) int32 (numpy, as llguidance fills it), bit j of word w is token
    32*w + j; tokens past 32*W are masked. The 0/-inf row is built in numpy (a bit unpack and a table
    lookup) and added: MLX's CPU ops took ~9 ms a token over Gemma 3's 262K vocabulary, this ~1 ms.
    """
    vocab = logits.shape[-1]
    bits = np.unpackbits(np.ascontiguousarray(bitmask).view(np.uint8), axis=-1, count=vocab, bitorder="little")
    return logits + mx.array(_ADDEND[bits]).astype(logits.dtype)


def metal_mask_available() -> bool:
    """Metal is the default device (Apple Silicon): mlx-vlm's kernel applies the mask there."""
    return bool(mx.default_device() == mx.gpu and mx.metal.is_available())


def _metal_apply(logits: mx.array, bitmask: np.ndarray) -> mx.array:
    from mlx_vlm.structured import _apply_llguidance_mask  # imported here: it builds a Metal kernel

    out: mx.array = _apply_llguidance_mask(logits, mx.array(bitmask))
    return out


class GrammarConstraint:
    """Per-request llguidance matcher as a logits processor: `processor(history, logits) -> logits`.

    Each call after the first advances the matcher with history[-1] (the token sampled last), unless
    `consume` already did; then it masks the logits. Once `is_finished`, only EOS stays allowed.
    """

    def __init__(self, compiled: CompiledGrammar, tokenizer: llg.LLTokenizer, *, metal: bool | None = None) -> None:
        self.compiled = compiled
        self._matcher = llg.LLMatcher(tokenizer, compiled.grammar, log_level=0)
        if self._matcher.is_error():
            raise StructuredOutputError(f"the grammar cannot be enforced: {self.error}")
        self._mask = llg_numpy.allocate_token_bitmask(1, tokenizer.vocab_size)
        self.uses_metal = metal_mask_available() if metal is None else metal
        self._apply = _metal_apply if self.uses_metal else apply_token_bitmask
        self._started = False
        self._advanced = False

    @property
    def is_finished(self) -> bool:
        """The grammar is complete: nothing but EOS may follow (the engine can stop now)."""
        return bool(self._matcher.is_stopped())

    @property
    def is_accepting(self) -> bool:
        """The output so far is a complete document (EOS is allowed), though it could go on."""
        return bool(self._matcher.is_accepting())

    @property
    def error(self) -> str | None:
        message = self._matcher.get_error()
        return first_line(message) if message else None

    def consume(self, token_id: int) -> None:
        """Advance with a sampled token (the engine may call this right after sampling, to test is_finished)."""
        self._advanced = True
        if not self._matcher.consume_token(token_id):
            raise GrammarViolation(f"structured output: token {token_id} rejected: {self.error}")

    def __call__(self, history: mx.array, logits: mx.array) -> mx.array:
        if self._started and not self._advanced:
            if history.size == 0:
                raise GrammarViolation("structured output needs the token history (sampler needs_history)")
            self.consume(_last_token(history))
        self._started, self._advanced = True, False
        return self.mask(logits)

    def mask(self, logits: mx.array) -> mx.array:
        """Mask (V,) or (1, V) logits with the matcher's current allowed set."""
        llg_numpy.fill_next_token_bitmask(self._matcher, self._mask, 0)
        if self._matcher.is_error():
            raise GrammarViolation(f"structured output: {self.error}")
        flat = logits.ndim == 1
        out = self._apply(logits[None] if flat else logits, self._mask)
        return out[0] if flat else out


def _last_token(history: mx.array) -> int:
    last = history.reshape(-1)[-1].item()
    if not isinstance(last, int):
        raise GrammarViolation(f"token history holds {type(last).__name__}s, not token ids")
    return last


def first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else message
