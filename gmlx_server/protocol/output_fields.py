"""Structured-output fields -> OutputFormat: shape checks only (types, depth, field names).

The grammar compiler (llguidance) is the service's: this layer never loads it. A route's own format object
(chat `response_format`, Responses `text.format`, Anthropic `output_config.format`) is json_schema or
json_object (text: none).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gmlx_server.errors import InvalidRequest, clip
from gmlx_server.generation_params import OutputFormat
from gmlx_server.protocol import jsonsafe
from gmlx_server.protocol.params import bad, json_type

FORMAT_TYPES = ("json_schema", "json_object", "text")
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
