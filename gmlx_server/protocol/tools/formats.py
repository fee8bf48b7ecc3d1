"""How each tool-call syntax's body becomes calls (the syntaxes themselves, and which template teaches which,
are the engine's table: gmlx_server/engine/tool_syntax.py).

Body parsing reuses mlx-vlm's parsers (json_tools, qwen3_coder, mistral, gemma4, pythonic) where
they fit. What is ours: the streaming (mlx-vlm's ToolCallDeltaState streams argument fragments
before a call is known to be valid, and covers only some formats), the end of calls that have no
closing marker (mlx-vlm ends them at a newline, which breaks pretty-printed JSON), Llama 3's bare
JSON calls and FunctionGemma (no mlx-vlm parser), and the template inference (mlx-vlm's registry
knows neither Llama 3 nor FunctionGemma, and needs `tool_call.name` in a Hermes template), and gmlx's own
JSON convention for templates that teach none.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from typing import Any

from gmlx_server.engine.tool_syntax import SYNTAXES, ToolSyntax, infer_tool_syntax
from gmlx_server.protocol.tools.call_stream import BodyEnd, BodyParser, ToolFormat, Tools
from gmlx_server.protocol.tools.mlx_vlm_parsers import mlx_vlm_parser
from gmlx_server.protocol.tools.parse_events import ParsedCall

_DECODER = json.JSONDecoder()
_GEMMA4_QUOTE = '<|"|>'  # Gemma 4's string delimiter token; FunctionGemma spells it <escape>
_MISTRAL_NAMED = re.compile(r"\s*([\w.-]+)(?:\[CALL_ID\][\w-]*)?\[ARGS\]\s*")
_MISTRAL_CALL_ID = re.compile(r"\[CALL_ID\][\w-]*")
_GEMMA_CALL = re.compile(r"\s*(?:call:)?[\w.:-]+(\{.*\})\s*", re.DOTALL)


def _strict(parse: Callable[[str, Tools], list[ParsedCall]]) -> BodyParser:
    """Any failure inside a vendored parser means 'malformed': the stream shows the text instead."""

    def wrapped(body: str, tools: Tools) -> list[ParsedCall]:
        try:
            return parse(body, tools)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, SyntaxError, RecursionError) as e:
            raise ValueError(f"malformed tool call: {e}") from e

    return wrapped


def _arguments(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, dict):
        raise ValueError("tool arguments are not a JSON object")
    return value


def _call(data: Any, args_keys: tuple[str, ...] = ("arguments", "parameters")) -> ParsedCall:
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"].strip():
        raise ValueError("a tool call needs a name")
    value = next((data[k] for k in args_keys if k in data), None)
    return ParsedCall(data["name"].strip(), _arguments(value))


def _calls(parsed: Any) -> list[ParsedCall]:
    return [_call(item) for item in (parsed if isinstance(parsed, list) else [parsed])]


def _json_end(text: str, start: int = 0) -> int | None:
    """End of the JSON value that starts (after whitespace) at `start`; None while it may be incomplete."""
    start += len(text) - start - len(text[start:].lstrip())
    if start >= len(text):
        return None
    try:
        return _DECODER.raw_decode(text, start)[1]
    except json.JSONDecodeError:
        return None


# Hermes / Qwen2.5: <tool_call>{"name": ..., "arguments": {...}}</tool_call>
def _hermes(body: str, tools: Tools) -> list[ParsedCall]:
    return _calls(mlx_vlm_parser("json_tools").parse_tool_call(body, tools))


# Qwen3-Coder / Qwen3.5: <tool_call><function=name><parameter=k>v</parameter></function></tool_call>
def _qwen3_coder(body: str, tools: Tools) -> list[ParsedCall]:
    return _calls(mlx_vlm_parser("qwen3_coder").parse_tool_call(body, tools))


# Llama 3.x: the whole message is {"name": ..., "parameters": {...}} (or follows <|python_tag|>).
def _llama3(body: str, tools: Tools) -> list[ParsedCall]:
    data = json.loads(body)
    if not isinstance(data, dict) or not ({"parameters", "arguments"} & data.keys()):
        raise ValueError("JSON without parameters is not a call")
    return [_call(data)]


# Mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (v3) or [TOOL_CALLS]name[ARGS]{...} (v11+).
def _mistral(body: str, tools: Tools) -> list[ParsedCall]:
    return _calls(mlx_vlm_parser("mistral").parse_tool_call(_MISTRAL_CALL_ID.sub("", body), tools))


def _mistral_end(text: str) -> int | None:
    stripped = text.lstrip()
    if stripped[:1] in ("[", "{"):
        return _json_end(text)
    named = _MISTRAL_NAMED.match(text)
    return _json_end(text, named.end()) if named else None


# Gemma 4 <|tool_call>call:name{k:<|"|>v<|"|>}<tool_call|> and FunctionGemma's <escape> spelling of it.
def _gemma(quote: str) -> BodyParser:
    def parse(body: str, tools: Tools) -> list[ParsedCall]:
        text = body.replace(quote, _GEMMA4_QUOTE)
        _check_gemma_shape(text)
        calls = _calls(mlx_vlm_parser("gemma4").parse_tool_call(text, tools))
        return [ParsedCall(c.name, _typed(c.arguments, _properties(tools, c.name))) for c in calls]

    return parse


def _properties(tools: Tools, name: str) -> dict[str, Any]:
    for tool in tools or ():
        fn = tool.get("function")
        if isinstance(fn, dict) and fn.get("name") == name and isinstance(fn.get("parameters"), dict):
            props = fn["parameters"].get("properties")
            return props if isinstance(props, dict) else {}
    return {}


def _typed(args: dict[str, Any], properties: dict[str, Any]) -> dict[str, Any]:
    """Quoted scalars as the tool's schema types them: FunctionGemma's template quotes every value."""
    out = dict(args)
    for key, value in args.items():
        kind = properties.get(key, {}).get("type") if isinstance(properties.get(key), dict) else None
        if not isinstance(value, str):
            continue
        if kind == "integer" and re.fullmatch(r"-?\d+", value):
            out[key] = int(value)
        elif kind == "number" and re.fullmatch(r"-?\d+(\.\d+)?([eE][-+]?\d+)?", value):
            out[key] = float(value) if not re.fullmatch(r"-?\d+", value) else int(value)
        elif kind == "boolean" and value in ("true", "false"):
            out[key] = value == "true"
    return out


def _check_gemma_shape(text: str) -> None:
    """mlx-vlm's gemma parser forgives unbalanced braces and open strings; we return those as text."""
    match = _GEMMA_CALL.fullmatch(text)
    if match is None or text.count(_GEMMA4_QUOTE) % 2:
        raise ValueError("not a gemma call")
    outside = "".join(match.group(1).split(_GEMMA4_QUOTE)[::2])  # the parts outside quoted strings
    depth = 0
    for at, ch in enumerate(outside):
        depth += (ch in "{[") - (ch in "}]")
        if depth < 0 or (depth == 0 and at < len(outside) - 1):
            raise ValueError("unbalanced gemma call")
    if depth:
        raise ValueError("unbalanced gemma call")


# Gemma 3 prompted style: ```tool_code\nget_weather(city="Paris")\n```
def _tool_code(body: str, tools: Tools) -> list[ParsedCall]:
    statements = ast.parse(body.strip()).body
    if not statements or not all(isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) for s in statements):
        raise ValueError("tool_code holds something other than calls")
    listed = ast.unparse(ast.List(elts=[s.value for s in statements if isinstance(s, ast.Expr)], ctx=ast.Load()))
    return _calls(mlx_vlm_parser("pythonic").parse_tool_call(listed, tools))


# gmlx's JSON convention (the server taught it): one object, or a list of them, and nothing else.
def _json(body: str, tools: Tools) -> list[ParsedCall]:
    calls = _calls(json.loads(body))
    if not calls:
        raise ValueError("an empty list of calls")
    return calls


_PARSERS: dict[str, tuple[BodyParser, BodyEnd | None]] = {
    "hermes": (_hermes, None),
    "qwen3_coder": (_qwen3_coder, None),
    "llama3_json": (_llama3, _json_end),
    "mistral": (_mistral, _mistral_end),
    "functiongemma": (_gemma("<escape>"), None),
    "gemma4": (_gemma(_GEMMA4_QUOTE), None),
    "gemma_tool_code": (_tool_code, None),
    "json": (_json, None),
}
FORMATS: dict[str, ToolFormat] = {
    name: ToolFormat(SYNTAXES[name], _strict(parse), end) for name, (parse, end) in _PARSERS.items()}


def format_of(syntax: ToolSyntax) -> ToolFormat:
    """The parser for a syntax of the engine's table."""
    return FORMATS[syntax.name]


def infer_tool_format(template_source: str) -> ToolFormat | None:
    """The call syntax a chat template teaches, with its parser; None: the template defines no tool calls."""
    syntax = infer_tool_syntax(template_source)
    return format_of(syntax) if syntax is not None else None
