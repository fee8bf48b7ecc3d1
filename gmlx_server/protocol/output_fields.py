"""Structured-output fields -> OutputFormat: shape checks only (types, sizes, depth, field names).

The grammar compiler (llguidance) is the service's: this layer never loads it. Spellings taken:
- a route's own format object: chat `response_format`, Responses `text.format`, Anthropic `output_config.format`,
  of type json_schema, json_object, regex, choice or grammar (text: none);
- vLLM's `structured_outputs` object: exactly one of json, json_object, regex, choice, grammar;
- llama-server's top-level `grammar` string (GBNF; llguidance's Lark too).
A request may carry one of them; two at once is a 400 naming both.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gmlx_server.errors import InvalidRequest, clip
from gmlx_server.generation_params import OutputFormat
from gmlx_server.protocol import jsonsafe
from gmlx_server.protocol.params import bad, json_type

MAX_GRAMMAR_CHARS = 100_000  # a regex or grammar text: far past any hand-written one, short of a compile stall
MAX_CHOICES = 1_000  # strings in a choice list
FORMAT_TYPES = ("json_schema", "json_object", "regex", "choice", "grammar", "text")
STRUCTURED_OUTPUTS_KEYS = ("json", "json_object", "regex", "choice", "grammar")
_OBJECT_SCHEMA: Mapping[str, Any] = {"type": "object"}


def format_object(fmt: Mapping[str, Any] | None, where: str) -> OutputFormat | None:
    """A route's format object (`where` names it); None for text or absent."""
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputFormat("json_object", where, where, schema=_OBJECT_SCHEMA)
    if kind == "json_schema":
        return _json_schema(fmt, where)
    if kind in ("regex", "grammar"):
        text = _text(fmt.get(kind), f"{where}.{kind}")
        return OutputFormat(kind, where, f"{where}.{kind}", pattern=text if kind == "regex" else None,
                            grammar=text if kind == "grammar" else None)
    if kind == "choice":
        return OutputFormat("choice", where, f"{where}.choice", choices=_choices(fmt.get("choice"), f"{where}.choice"))
    raise bad(f"{where}.type", f"{clip(str(kind))!r} is not supported; use one of {', '.join(FORMAT_TYPES)}")


def _json_schema(fmt: Mapping[str, Any], where: str) -> OutputFormat:
    # OpenAI nests it under json_schema.schema; Responses and Anthropic have it at the top.
    holder = fmt.get("json_schema", fmt)
    param = f"{where}.json_schema.schema" if where == "response_format" else f"{where}.schema"
    schema = holder.get("schema") if isinstance(holder, Mapping) else None
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise bad(param, f"json_schema needs an object here, got {json_type(schema)}")
    return OutputFormat("json_schema", where, param, schema=_shallow(schema, where))


def _shallow(schema: dict[str, Any], where: str) -> dict[str, Any]:
    if jsonsafe.depth_of(schema) > jsonsafe.MAX_SCHEMA_DEPTH:  # the schema checkers recurse per level
        raise InvalidRequest(f"'{where}': nested deeper than {jsonsafe.MAX_SCHEMA_DEPTH} levels of arrays and "
                             "objects (the limit for a JSON schema)", param=where, code="json_too_deep")
    return schema


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str) or not value:
        raise bad(param, f"expected a non-empty string, got {json_type(value)}")
    if len(value) > MAX_GRAMMAR_CHARS:
        raise bad(param, f"{len(value)} characters; the limit is {MAX_GRAMMAR_CHARS}")
    return value


def _choices(value: Any, param: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
        raise bad(param, "expected a non-empty array of non-empty strings")
    if len(value) > MAX_CHOICES or sum(map(len, value)) > MAX_GRAMMAR_CHARS:
        raise bad(param, f"at most {MAX_CHOICES} choices of {MAX_GRAMMAR_CHARS} characters in all")
    return tuple(value)


def structured_outputs(body: Mapping[str, Any]) -> OutputFormat | None:
    """vLLM's `structured_outputs`: one constraint; its other options are refused by name, not ignored."""
    so = body.get("structured_outputs")
    if so is None:
        return None
    if not isinstance(so, dict):
        raise bad("structured_outputs", f"expected an object, got {json_type(so)}")
    unknown = [k for k in so if k not in STRUCTURED_OUTPUTS_KEYS and so[k] is not None]
    if unknown:
        raise bad(f"structured_outputs.{clip(unknown[0])}",
                  f"not supported; structured_outputs takes one of {', '.join(STRUCTURED_OUTPUTS_KEYS)}")
    set_keys = [k for k in STRUCTURED_OUTPUTS_KEYS if so.get(k) not in (None, False)]
    if len(set_keys) != 1:
        raise bad("structured_outputs", f"expected exactly one of {', '.join(STRUCTURED_OUTPUTS_KEYS)}, got "
                  f"{', '.join(set_keys) or 'none'}")
    return _structured_output(set_keys[0], so[set_keys[0]])


def _structured_output(key: str, value: Any) -> OutputFormat:
    where, param = "structured_outputs", f"structured_outputs.{key}"
    if key == "json_object":
        if value is not True:
            raise bad(param, f"expected true, got {json_type(value)}")
        return OutputFormat("json_object", where, param, schema=_OBJECT_SCHEMA)
    if key == "json":
        schema = _json_text(value, param) if isinstance(value, str) else value
        if isinstance(schema, bool):
            schema = {} if schema else {"not": {}}
        if not isinstance(schema, dict):
            raise bad(param, f"expected a JSON schema (an object, or its JSON text), got {json_type(value)}")
        return OutputFormat("json_schema", where, param, schema=_shallow(schema, param))
    if key == "choice":
        return OutputFormat("choice", where, param, choices=_choices(value, param))
    text = _text(value, param)
    return OutputFormat("regex", where, param, pattern=text) if key == "regex" else \
        OutputFormat("grammar", where, param, grammar=text)


def _json_text(value: str, param: str) -> Any:
    jsonsafe.check_depth(value.encode(), param, jsonsafe.MAX_SCHEMA_DEPTH)
    try:
        return json.loads(value)
    except ValueError as e:
        raise bad(param, f"not valid JSON: {e}") from None


def grammar_field(body: Mapping[str, Any]) -> OutputFormat | None:
    """llama-server's top-level `grammar` (GBNF); an empty string means none, as there."""
    value = body.get("grammar")
    if value is None or value == "":
        return None
    return OutputFormat("grammar", "grammar", "grammar", grammar=_text(value, "grammar"))


def output_format(body: Mapping[str, Any], native: OutputFormat | None) -> OutputFormat | None:
    """The route's own format (parsed by its caller), vLLM's structured_outputs or llama-server's grammar: one."""
    found = [f for f in (native, structured_outputs(body), grammar_field(body)) if f is not None]
    if len(found) > 1:
        first, second = found[0].source, found[1].source
        raise bad(second, f"cannot be combined with '{first}': send one structured-output field")
    return found[0] if found else None
