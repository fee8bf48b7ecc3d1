"""Tool calls as an llguidance grammar: the output is held to a valid call of an offered function, in the
request's syntax, its arguments matching the function's JSON schema.

- `required` / a named function: the reply is exactly one call (the grammar then ends the generation);
- `auto`: free text, or free text that opens a call, which from its marker on must be valid (llguidance's
  lazy lexeme ends the text at the marker); one call, then the generation ends.

Only syntaxes whose body is one JSON object per call (`ToolSyntax.args_key`) can be held to a grammar.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import llguidance as llg

from gmlx_server.engine.structured import JSON_OPTIONS, StructuredOutputError, first_line
from gmlx_server.engine.tool_syntax import ToolSyntax
from gmlx_server.engine.types import CompiledGrammar

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # a TypedDict that exists only in the stub

log = logging.getLogger("gmlx.tools")

# Tools' schemas use keywords llguidance does not implement (propertyNames, ...): ignored, not refused.
_CALL_OPTIONS: JsonCompileOptions = {**JSON_OPTIONS, "lenient": True, "coerce_one_of": True}
_ANY_OBJECT: dict[str, Any] = {"type": "object"}
_TEXT = r"/(.|\n)*/"


def tool_functions(tools: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """name -> parameters schema of each offered function (tools in the chat-template shape)."""
    out: dict[str, Mapping[str, Any]] = {}
    for tool in tools:
        fn = tool.get("function")
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out[fn["name"]] = params if isinstance(params, Mapping) else _ANY_OBJECT
    return out


_NESTED_MAPS = ("properties", "$defs", "definitions")
_NESTED_LISTS = ("anyOf", "oneOf", "prefixItems")  # not allOf: closing its parts would reject their union


def closed(schema: Any) -> Any:
    """Objects that list their properties take no others unless the schema says so: left open, a small model
    invents keys until max_tokens. What it writes still matches the tool's own schema."""
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _NESTED_MAPS and isinstance(value, Mapping):
            value = {k: closed(v) for k, v in value.items()}
        elif key in _NESTED_LISTS and isinstance(value, list):
            value = [closed(v) for v in value]
        elif key == "items":
            value = closed(value)
        out[key] = value
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def _arguments_schema(params: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments are a JSON object whatever the schema leaves open."""
    if params.get("type") not in (None, "object"):
        return dict(_ANY_OBJECT)
    schema: dict[str, Any] = closed(params)
    schema["type"] = "object"
    return schema


def _call_schema(syntax: ToolSyntax, name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    key = syntax.args_key or "arguments"
    return {"type": "object", "properties": {"name": {"const": name}, key: _arguments_schema(params)},
            "required": ["name", key], "additionalProperties": False}


def _check(schema: Mapping[str, Any]) -> str | None:
    """llguidance's complaint about a JSON schema, or None when it can enforce it."""
    try:
        grammar = llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=_CALL_OPTIONS)
    except ValueError as e:
        return first_line(str(e))
    failed, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar)
    return first_line(messages[0]) if failed and messages else ("rejected" if failed else None)


def call_schema(syntax: ToolSyntax, functions: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """One JSON schema for a call of any of `functions`; a function whose schema llguidance cannot enforce
    keeps only 'an object' for its arguments (said in the log)."""
    options = []
    for name, params in functions.items():
        schema = _call_schema(syntax, name, params)
        problem = _check(schema)
        if problem is not None:
            log.warning("tool %r: its parameters schema cannot be enforced (%s); its arguments are only held to "
                        "a JSON object", name, problem)
            schema = _call_schema(syntax, name, _ANY_OBJECT)
        options.append(schema)
    return {"anyOf": options, "x-guidance": _CALL_OPTIONS}


def _marker(text: str, special: Mapping[str, int]) -> str:
    """A marker as a Lark item: a special token by id (text cannot spell it), else the literal."""
    return f"<[{special[text]}]>" if text in special else json.dumps(text)


def tool_call_lark(syntax: ToolSyntax, schema: Mapping[str, Any], forced: bool,
                   special: Mapping[str, int]) -> str:
    """The Lark grammar of a reply: exactly one call when `forced`, else text or text + one call."""
    body = f"%json {json.dumps(schema)}"
    if syntax.leading_json:  # Llama 3: the call is a bare JSON message
        return f"start: {body}\n" if forced else f"start: TEXT | {body}\nTEXT: /[^{{](.|\\n)*/\n"
    nl = ' "\\n"' if syntax.newlines else ""
    rest = f"{nl} {body}{nl} {_marker(syntax.end, special)}" if syntax.end else f" {body}"
    opener = syntax.starts[0]
    if forced:
        return f"start: {_marker(opener, special)}{rest}\n"
    if opener in special:  # text cannot hold a special token: the text lexeme ends where it appears
        return f"start: TEXT | TEXT {_marker(opener, special)}{rest}\nTEXT: {_TEXT}\n"
    return f"start: TEXT | opened{rest}\nopened[lazy]: TEXT {json.dumps(opener)}\nTEXT: {_TEXT}\n"


def compile_tool_grammar(syntax: ToolSyntax, tools: Sequence[Mapping[str, Any]], choice: str | None,
                         special: Mapping[str, int] | None = None) -> CompiledGrammar:
    """The grammar for a reply to `tools` under `choice` (auto, required, or a function's name).

    Raises StructuredOutputError when the syntax cannot be constrained or the grammar does not compile."""
    if syntax.args_key is None:
        raise StructuredOutputError(f"tool-call syntax {syntax.name!r} cannot be constrained", param="tool_choice")
    functions = tool_functions(tools)
    if choice not in (None, "auto", "required"):
        functions = {choice: functions[choice]} if choice in functions else {}
    if not functions:
        raise StructuredOutputError(f"tool_choice names no offered function ({choice!r})", param="tool_choice")
    schema = call_schema(syntax, functions)
    lark = "%llguidance {}\n" + tool_call_lark(syntax, schema, choice not in (None, "auto"), special or {})
    try:
        grammar = llg.LLMatcher.grammar_from_lark(lark)
    except ValueError as e:
        raise StructuredOutputError(f"tool grammar does not compile: {first_line(str(e))}", param="tools") from e
    failed, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        raise StructuredOutputError(f"tool grammar cannot be enforced: {first_line(messages[0])}", param="tools")
    return CompiledGrammar("tool_call", schema, grammar)
