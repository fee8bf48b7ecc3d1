"""The request's output format compiled with llguidance (engine/structured.py), in a worker thread and before
a model loads for it: a format that cannot be enforced is a 400 naming its field, before any generation."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from gmlx_server.errors import InvalidRequest
from gmlx_server.generation_params import OutputFormat

if TYPE_CHECKING:
    from gmlx_server.engine.types import CompiledGrammar


async def compile_format(fmt: OutputFormat | None) -> CompiledGrammar | None:
    """None for free text; else the checked grammar, or InvalidRequest naming where the payload sits."""
    if fmt is None:
        return None
    from gmlx_server.engine.structured import StructuredOutputError  # llguidance: loaded when a request needs it

    try:
        return await asyncio.to_thread(_compile, fmt)
    except StructuredOutputError as e:
        raise InvalidRequest(f"'{fmt.param}': {e}", param=fmt.param) from None


def _compile(fmt: OutputFormat) -> CompiledGrammar:
    from gmlx_server.engine import structured

    if fmt.kind in ("json_schema", "json_object") and fmt.schema is not None:
        return structured.json_grammar(fmt.schema, "json_object" if fmt.kind == "json_object" else "json_schema")
    if fmt.kind == "regex" and fmt.pattern is not None:
        return structured.regex_grammar(fmt.pattern)
    if fmt.kind == "choice":
        return structured.choice_grammar(fmt.choices)
    if fmt.kind == "grammar" and fmt.grammar is not None:
        return structured.lark_grammar(fmt.grammar)
    raise ValueError(f"output format {fmt.kind!r} without its payload")  # the protocol layer never builds one
