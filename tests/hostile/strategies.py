"""Hypothesis strategies for hostile requests to every route: a valid body with one field (at any depth)
swapped for a hostile value, or a hostile body outright, serialized to raw bytes so that what JSON
libraries refuse to write (1e400, NaN, lone surrogates, invalid UTF-8, 5000-deep nesting) is sent too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from hypothesis import strategies as st

from gmlx_server.protocol.jsonsafe import MAX_DEPTH
from gmlx_server.protocol.params import PARAMETER_TABLE


class Raw(str):
    """JSON text sent as is (numbers out of double range, NaN, nesting no encoder would build)."""


def nest(depth: int, leaf: str = "1") -> Raw:
    return Raw("[" * depth + leaf + "]" * depth)


def encode(value: Any) -> str:
    """JSON text; Raw pieces verbatim; lone surrogates as their \\uXXXX escapes (ensure_ascii)."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {encode(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(encode(v) for v in value) + "]"
    return json.dumps(value)


NUMBERS = [0, -1, -0.0, 0.5, 1.5, 2**31, 2**53 + 1, 2**63, 2**64, 2**70, -(2**63) - 1, 1e308, -1e308, 5e-324,
           Raw("1e400"), Raw("-1e400"), Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("-0"), Raw("1E+2"),
           Raw("0.0000000000000000000000000001")]
STRINGS = ["", " ", "\ud800", "\udfff", "a\ud83db", "\udc00\ud800", "\x00", "\u202e\u2066", "{{ 7 * 7 }}",
           "{% raise %}", "<|im_end|>", "<tool_call>", "null", "-1", "../../etc/passwd"]
SHAPES: list[Any] = [None, True, False, [], {}, [[1, 2, 3]], [None], [{}], {"type": 5}, {"\ud800": 1},
                     {"type": "text", "text": 5}, {"name": "f"}]


# Big values are built on demand (and named, so a failing example prints short).
def digits_5001() -> Raw:
    return Raw("1" + "0" * 5000)  # past Python's int-from-text digit limit


def text_70k() -> str:
    return "x" * 70_000  # far more tokens than the context window


def newlines_5k() -> str:
    return "\n" * 5000


def strings_20k() -> list[str]:
    return ["a"] * 20_000


def objects_2k() -> list[dict[str, str]]:
    return [{"a": "b"}] * 2_000


def nest_under_limit() -> Raw:
    return nest(MAX_DEPTH - 3)


def nest_over_limit() -> Raw:
    return nest(MAX_DEPTH + 1)


def nest_990() -> Raw:
    return nest(990)


def nest_5000() -> Raw:
    return nest(5000)


def objects_600_deep() -> Raw:
    return Raw('{"a": ' * 600 + "1" + "}" * 600)


BIG = [digits_5001, text_70k, newlines_5k, strings_20k, objects_2k, nest_under_limit, nest_over_limit, nest_990,
       nest_5000, objects_600_deep]


def scalars() -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from(NUMBERS), st.sampled_from(STRINGS), st.text(max_size=12),
                     st.integers(), st.floats(allow_nan=False, allow_infinity=False))


def hostile() -> st.SearchStrategy[Any]:
    """One hostile JSON value: wrong types, extreme numbers, surrogates, deep or huge containers."""
    small = st.recursive(scalars(), lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["type", "text", "name", "a", "\ud800"]),
                                                    inner, max_size=3)), max_leaves=6)
    return st.one_of(scalars(), st.sampled_from(SHAPES), st.sampled_from(BIG).map(lambda make: make()), small)


# --- valid bodies per route, whose every field (and every nested field) is a place to put hostility ------

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
CHAT = {
    "model": "MODEL", "max_tokens": 1, "temperature": 0,
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Call f."}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "2"},
        {"role": "user", "content": "Say hi."},
    ],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": SCHEMA}}],
    "tool_choice": "auto", "stop": ["\n\n"], "logit_bias": {"5": 1}, "stream_options": {"include_usage": True},
    "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}},
    "reasoning": {"effort": "low"}, "chat_template_kwargs": {"x": 1},
}
COMPLETION = {"model": "MODEL", "prompt": "Hello", "max_tokens": 1, "stop": ["x"], "temperature": 0}
MESSAGES = {
    "model": "MODEL", "max_tokens": 1, "temperature": 0, "system": [{"type": "text", "text": "Be brief."}],
    "messages": [
        {"role": "user", "content": "Call f."},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "ok"},
                                          {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "2", "is_error": False},
                                     {"type": "text", "text": "Say hi."}]},
    ],
    "tools": [{"name": "f", "description": "d", "input_schema": SCHEMA}], "tool_choice": {"type": "auto"},
    "thinking": {"type": "enabled", "budget_tokens": 16}, "stop_sequences": ["\n\n"],
    "output_config": {"effort": "low", "format": {"type": "json_schema", "schema": SCHEMA}},
    "metadata": {"user_id": "u"},
}
RESPONSES = {
    "model": "MODEL", "max_output_tokens": 1, "temperature": 0, "instructions": "Be brief.", "store": False,
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Call f."}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\": 1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "2"},
        {"type": "message", "role": "user", "content": "Say hi."},
    ],
    "tools": [{"type": "function", "name": "f", "parameters": SCHEMA}], "tool_choice": "auto",
    "text": {"format": {"type": "json_schema", "name": "s", "schema": SCHEMA}}, "metadata": {"k": "v"},
}
# Every POST route's valid bodies; a route missing here fails test_every_route_has_a_strategy.
BODIES: dict[str, list[dict[str, Any]]] = {
    "/v1/chat/completions": [CHAT, {"model": "MODEL", "messages": [{"role": "user", "content": "hi"}],
                                    "max_tokens": 1, "dry_run": True}],
    "/v1/completions": [COMPLETION],
    "/v1/messages": [MESSAGES],
    "/v1/messages/count_tokens": [MESSAGES],
    "/v1/responses": [RESPONSES],
    "/v1/estimate": [CHAT],
    "/unload": [{"model": "MODEL"}],
    "/v1/keep": [{"model": "MODEL", "keep": True, "warm": False}],
    "/v1/reload": [{}],
    "/v1/cache/reset": [{"model": "MODEL"}],
    # The tokenizer routes, each also under /v1: text and a chat prompt, ids back to text, the rendered prompt.
    **{prefix + path: bodies for path, bodies in {
        "/tokenize": [{"model": "MODEL", "content": "Hello", "with_pieces": True, "add_special": True},
                      {"model": "MODEL", "messages": [{"role": "user", "content": "hi"}], "return_token_strs": True}],
        "/detokenize": [{"model": "MODEL", "tokens": [1, 2, 3]}],
        "/apply-template": [{"model": "MODEL", "messages": [{"role": "user", "content": "hi"}],
                             "add_generation_prompt": False, "chat_template_kwargs": {"x": 1}}],
    }.items() for prefix in ("", "/v1")},
    # The services (unconfigured in the hostile apps: tests/auxiliary fuzzes them configured).
    "/v1/embeddings": [{"input": ["a b", "c"], "encoding_format": "float", "dimensions": 8, "truncate": False}],
    "/v1/rerank": [{"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1, "return_documents": True}],
    "/rerank": [{"query": "q", "documents": ["a"]}],
    "/v1/audio/transcriptions": [{"model": "whisper-1"}],
    "/v1/audio/translations": [{"model": "whisper-1"}],
    "/v1/audio/speech": [{"input": "hi", "voice": "alloy", "response_format": "wav", "speed": 1.0}],
    "/v1/systemone": [{}],
    "/systemone": [{}],
}
# Top-level fields a body may set that the bases above leave out: each gets hostile values too.
EXTRA_FIELDS = sorted({*PARAMETER_TABLE, "stream", "n", "best_of", "echo", "suffix", "dry_run", "profile",
                       "previous_response_id", "input", "prompt", "system", "messages", "keep", "warm"})


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON value: each key of each object and each index of each array."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        yield (*prefix, k)
        yield from paths(v, (*prefix, k))


def put(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    """A copy of `value` with `new` at `path` (the containers on the way copied, the rest shared)."""
    if not path:
        return new
    copy: Any = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = put(copy[path[0]], path[1:], new) if path[1:] else new
    return copy


@dataclass(frozen=True)
class Hostile:
    method: str
    path: str
    body: bytes | None = None

    def __repr__(self) -> str:  # hypothesis prints this on failure: keep it readable
        shown = self.body if self.body is None or len(self.body) < 400 else self.body[:400] + b"..."
        return f"Hostile({self.method} {self.path[:300]}, body={shown!r})"


def _bodies(route: str, model: str) -> st.SearchStrategy[bytes]:
    bases = [json.loads(json.dumps(b).replace("MODEL", model)) for b in BODIES[route]]

    @st.composite
    def mutated(draw: st.DrawFn) -> bytes:
        base = draw(st.sampled_from(bases))
        for _ in range(draw(st.integers(1, 2))):
            spots = [*paths(base), *((f,) for f in EXTRA_FIELDS if not isinstance(base, dict) or f not in base)]
            base = put(base, draw(st.sampled_from(spots)), draw(hostile()))
        return encode(base).encode()

    whole = st.one_of(hostile().map(lambda v: encode(v).encode()), st.sampled_from([b"", b" ", b"{", b"{}}", b"\xff"]))
    return st.one_of(*[mutated()] * 6, whole, _bad_utf8(st.sampled_from(bases)))  # mostly one field at a time


def _bad_utf8(bases: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[bytes]:
    """A valid body with invalid UTF-8 (a stray byte, an encoded surrogate, an overlong form) spliced in."""
    @st.composite
    def spliced(draw: st.DrawFn) -> bytes:
        raw = encode(draw(bases)).encode()
        at = draw(st.integers(0, len(raw)))
        return raw[:at] + draw(st.sampled_from([b"\xff", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe2\x82"])) + raw[at:]
    return spliced()


QUERY_VALUES = ["", "0", "-1", "1", "2", "64", "8192", "json", "prometheus", "1e400", "NaN",
                "99999999999999999999999", "%FF", "%ED%A0%80", "%00", "a b", "x" * 5000, "[]", "true"]
GET_PARAMS = {"/": [], "/health": ["ready"], "/v1/metrics": ["format"], "/metrics": ["format"],
              "/v1/capacity/plan": ["width", "depth", "key"], "/v1/models": [], "/models": [], "/v1/cache/stats": [],
              "/v1/models/{model_id:path}": [], "/openapi.json": []}


def _query(route: str, model: str) -> st.SearchStrategy[str]:
    names = GET_PARAMS[route]
    value = st.one_of(st.sampled_from(QUERY_VALUES), st.text(max_size=8).map(lambda s: quote(s, safe="")))
    pairs = st.lists(st.tuples(st.sampled_from([*names, "x"]), value), max_size=3)
    ids = st.one_of(st.just(model), st.sampled_from(["%FF", "%ED%A0%80", "..", "a/b/c", "x" * 3000, "%00"]),
                    value)
    return st.builds(lambda mid, ps: route.replace("{model_id:path}", mid) + ("?" + "&".join(f"{k}={v}" for k, v in ps)
                                                                       if ps else ""), ids, pairs)


def requests(method: str, route: str, model: str) -> st.SearchStrategy[Hostile]:
    """Hostile requests for one (method, route) of the app's route table."""
    if method == "POST":
        return _bodies(route, model).map(lambda body: Hostile(method, route, body))
    return _query(route, model).map(lambda target: Hostile(method, target))


def covered(method: str, route: str) -> bool:
    return route in (BODIES if method == "POST" else GET_PARAMS)
