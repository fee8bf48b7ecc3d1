"""The parameter table (which request fields each route honors or ignores) and the field validators
every protocol parser shares.

`ignored_fields` names what a body sets that its route ignores; the server warns about a client's field set
once an hour (gmlx_server/serving/ignored_fields.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

from gmlx_server.config import PRIORITIES, PRIORITY_LIMIT, SAMPLING_KNOBS
from gmlx_server.errors import InvalidRequest, clip
from gmlx_server.protocol.lifetime import parse_duration

T = TypeVar("T")
Route = Literal["chat", "responses", "messages", "completions"]
ROUTES: tuple[Route, ...] = ("chat", "responses", "messages", "completions")
_H, _I = "honored", "ignored"
_CHECKED = "checked"  # validated and never warned about (completions rejects n > 1 and best_of > 1)

# The table. /v1/completions takes standard sampling, seed, stop, stream, stream_options, profile and the
# structured-output fields; no template, no logprobs.
#                         chat responses messages completions
PARAMETER_TABLE: Mapping[str, tuple[str, str, str, str]] = {
    "max_completion_tokens": (_H, _I, _I, _I),
    "n": (_I, _I, _I, _CHECKED),
    "user": (_I, _I, _I, _I),
    "parallel_tool_calls": (_H, _H, _I, _I),  # Anthropic's is tool_choice.disable_parallel_tool_use
    "tool_choice": (_H, _H, _H, _I),
    "metadata": (_I, _I, _I, _I),
    "output_config": (_I, _I, _H, _I),
    "logit_bias": (_H, _H, _H, _H),
    "stream_options": (_H, _I, _I, _H),
    "timings_per_token": (_H, _I, _I, _I),
    "response_format": (_H, _H, _H, _H),
    "structured_outputs": (_H, _H, _H, _H),  # vLLM's spelling
    "grammar": (_H, _H, _H, _H),  # llama-server's (GBNF)
    "logprobs": (_H, _I, _I, _I),
    "top_logprobs": (_H, _I, _I, _I),
    "stop": (_H, _I, _I, _H),
    "stop_sequences": (_I, _I, _H, _I),
    "chat_template_kwargs": (_H, _H, _H, _I),
    "profile": (_H, _H, _H, _H),
    "priority": (_H, _H, _H, _H),
    # Standard parameters: honored by every generation route (every sampling knob). Thinking controls act on
    # the chat template, which /v1/completions does not use, so they are ignored there.
    **{k: (_H, _H, _H, _H) for k in ("max_tokens", "max_output_tokens", *SAMPLING_KNOBS, "keep_alive", "ttl")},
    **{k: (_H, _H, _H, _I) for k in ("enable_thinking", "thinking_budget", "reasoning", "reasoning_effort")},
}


def ignored_params(route: Route, body: Mapping[str, Any]) -> list[str]:
    """Table parameters this route ignores that the body sets (present and not null)."""
    col = ROUTES.index(route)
    return [k for k, row in PARAMETER_TABLE.items() if row[col] == _I and body.get(k) is not None]


def ignored_fields(route: Route, body: Mapping[str, Any]) -> tuple[str, ...]:
    """The ignored table parameters, then `tool:TYPE` for each kind of tool the model is not offered: a hosted
    Responses tool (not type function), an Anthropic server tool (no input_schema)."""
    tools = body.get("tools") if route in ("responses", "messages") else None
    kinds: dict[str, None] = {}
    for t in tools if isinstance(tools, list) else ():
        if isinstance(t, dict) and (t.get("type") != "function" if route == "responses" else "input_schema" not in t):
            kinds[f"tool:{t.get('type') or t.get('name')}"] = None
    return (*ignored_params(route, body), *kinds)


# --- field validators: each returns the value (None when absent) or raises InvalidRequest ----------

def bad(name: str, what: str) -> InvalidRequest:
    """The 400 for field `name` (a path such as messages[2].content)."""
    return InvalidRequest(f"'{name}': {what}", param=name)


def number(body: Mapping[str, Any], name: str, lo: float, hi: float, lo_open: bool = False) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise bad(name, f"expected a number, got {json_type(v)}")
    if v < lo or v > hi or (lo_open and v == lo):
        raise bad(name, f"must be {'>' if lo_open else '>='} {lo} and <= {hi}, got {v}")
    return float(v)


def integer(body: Mapping[str, Any], name: str, lo: int, hi: int = 2**63 - 1) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)  # some clients send 256.0
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(name, f"expected an integer, got {json_type(v)}")
    if v < lo or v > hi:
        raise bad(name, f"must be between {lo} and {hi}, got {v}")
    return v


def boolean(body: Mapping[str, Any], name: str) -> bool | None:
    v = body.get(name)
    if v is None or isinstance(v, bool):
        return v
    raise bad(name, f"expected a boolean, got {json_type(v)}")


def string(body: Mapping[str, Any], name: str, choices: Sequence[str] | None = None) -> str | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, str):
        raise bad(name, f"expected a string, got {json_type(v)}")
    if choices is not None and v not in choices:
        raise bad(name, f"expected one of {', '.join(choices)}, got {v!r}")
    return v


def obj(body: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    v = body.get(name)
    if v is None or isinstance(v, dict):
        return v
    raise bad(name, f"expected an object, got {json_type(v)}")


def nested(check: Callable[..., T], owner: Mapping[str, Any], name: str, path: str, *args: Any) -> T:
    """Run a field validator on `owner[name]`, a field deeper in the body, naming it by its `path`."""
    return check({path: owner.get(name)}, path, *args)


def required_string(owner: Mapping[str, Any], name: str, where: str) -> str:
    """A string field of a nested object (a content block, an input item), named `where.name`."""
    v = owner.get(name)
    if not isinstance(v, str):
        raise bad(f"{where}.{name}", f"expected a string, got {json_type(v)}")
    return v


def array_of(body: Mapping[str, Any], name: str, convert: Callable[[int, Any], T | None]) -> tuple[T, ...]:
    """An optional array field, each item converted; items that convert to None are left out."""
    raw = body.get(name)
    if raw is not None and not isinstance(raw, list):
        raise bad(name, f"expected an array, got {json_type(raw)}")
    return tuple(x for x in (convert(i, item) for i, item in enumerate(raw or [])) if x is not None)


def json_type(v: object) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    return "null" if v is None else names.get(type(v), type(v).__name__)


def sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling fields the request sets explicitly (they override any profile value), each checked against
    its knob (config/sampling.py)."""
    out: dict[str, Any] = {}
    for name, knob in SAMPLING_KNOBS.items():
        if knob.kind == "number":
            v: Any = number(body, name, knob.lo, knob.hi, knob.lo_open)
        elif knob.kind == "integer":
            v = integer(body, name, int(knob.lo), int(knob.hi))
        else:
            v = boolean(body, name)
        if v is not None:
            out[name] = v
    if out.get("top_k") == -1:
        out["top_k"] = 0  # -1 means "off" in llama.cpp-style clients
    return out


def logit_bias(body: Mapping[str, Any]) -> dict[int, float]:
    """Keys are token ids (strings in JSON); values -100..100 as in OpenAI."""
    raw = obj(body, "logit_bias") or {}
    out: dict[int, float] = {}
    for k, v in raw.items():
        try:
            tid = int(k)
        except ValueError:
            raise bad("logit_bias", f"keys must be token ids, got {k!r}") from None
        if tid < 0:
            raise bad("logit_bias", f"token ids must not be negative, got {k!r}")
        out[tid] = number({"logit_bias": v}, "logit_bias", -100.0, 100.0) or 0.0
    return out


def stop(body: Mapping[str, Any], name: str = "stop", limit: int = 16) -> tuple[str, ...]:
    """`stop` (chat, completions) or `stop_sequences` (messages): non-empty strings, at most `limit`."""
    v = body.get(name)
    if v is None:
        return ()
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise bad(name, "expected a string or an array of strings")
    if len(items) > limit:
        raise bad(name, f"at most {limit} stop strings, got {len(items)}")
    return tuple(s for s in items if s)


def max_tokens(body: Mapping[str, Any], names: Sequence[str]) -> int | None:
    """The first of `names` the body sets (validated >= 1); the order encodes which spelling wins."""
    values = [integer(body, n, 1) for n in names]
    return next((v for v in values if v is not None), None)


def generation_basics(body: Mapping[str, Any]) -> dict[str, Any]:
    """model, profile, sampling, logit_bias, stream, priority, keep_alive: what every generation route reads."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("model", f"expected a string, got {json_type(model)}")
    return {"model": model or "", "profile": string(body, "profile") or None, "sampling": sampling(body),
            "logit_bias": logit_bias(body), "stream": bool(boolean(body, "stream")), "priority": priority(body),
            "keep_alive_s": keep_alive(body)}


KEEP_ALIVE_FIELDS = ("keep_alive", "ttl")  # Ollama's word and LM Studio's, for one setting


def keep_alive(body: Mapping[str, Any]) -> float | None:
    """How long the model stays resident once this request ends, in seconds (math.inf: no end, 0: unload it
    then); None when the body sets neither `keep_alive` nor `ttl`, a 400 naming the field when it sets both."""
    given = [name for name in KEEP_ALIVE_FIELDS if body.get(name) is not None]
    if len(given) > 1:
        raise bad("ttl", "'keep_alive' and 'ttl' both set how long the model stays loaded; send one of them")
    return lifetime(body[given[0]], given[0]) if given else None


def lifetime(v: Any, name: str) -> float:
    """A number of seconds or a duration string; any negative value is math.inf (kept with no end)."""
    try:
        if isinstance(v, str):
            seconds = parse_duration(v)
        elif isinstance(v, int | float) and not isinstance(v, bool):
            seconds = float(v)
        else:
            raise bad(name, f"expected a number of seconds or a duration string, got {json_type(v)}")
    except (ValueError, OverflowError):  # overflow: an integer beyond any float
        raise bad(name, f'expected a duration such as "10m", "1h30m" or "45s", a number of seconds, or -1 '
                        f"(no end), got {clip(str(v))!r}") from None
    if not math.isfinite(seconds):
        raise bad(name, f"out of range, got {clip(str(v))!r}")
    return math.inf if seconds < 0 else seconds


def priority(body: Mapping[str, Any]) -> int | None:
    """`priority`: interactive, normal or batch, or an integer as vLLM takes it (lower runs sooner); None when
    absent (the profile's, else normal)."""
    v = body.get("priority")
    if isinstance(v, str):
        if v not in PRIORITIES:
            raise bad("priority", f"expected one of {', '.join(PRIORITIES)} or an integer, got {clip(v)!r}")
        return PRIORITIES[v]
    return integer(body, "priority", -PRIORITY_LIMIT, PRIORITY_LIMIT)
