"""Tool calling on any model: which syntax a request's reply uses, and, for gmlx's own JSON convention, the
prompt that teaches it.

A model's `tool_format` (config) chooses: `auto` keeps the template's own syntax and uses gmlx's where the
template has none; `template` keeps whatever the template does (a template without a syntax then answers
in text); `json` always uses gmlx's. With gmlx's convention the tools go into the system prompt as a block
that describes each function and the call form, and earlier calls and results become text in that form,
so the template sees plain turns. Pure functions but for the one log line per template.
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gmlx_server.config.settings import ToolFormatSetting
from gmlx_server.engine.tool_syntax import GMLX_JSON, ToolSource, ToolSyntax, infer_tool_syntax
from gmlx_server.engine.types import ChatTemplate
from gmlx_server.generation_params import GenerationParams
from gmlx_server.serving.roles import function_of, join_contents, plain_tool_turns

log = logging.getLogger("gmlx.tools")
Message = dict[str, Any]

# Keyed by the template object, which lives exactly as long as its engine: one inference (and log) per load.
_INFERRED: weakref.WeakKeyDictionary[ChatTemplate, ToolSyntax | None] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class ToolPlan:
    """A request's tool calls: the syntax the reply is parsed in, and who taught it to the model."""

    syntax: ToolSyntax
    source: ToolSource
    compact: bool = False  # the tools are rendered compactly (compact_tools): in full they would not fit

    def rendered(self, tools: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The tools as the prompt shows them; the grammar and the parser keep the full ones."""
        return [compact_tool(t) for t in tools] if self.compact else list(tools)

    @property
    def prompted(self) -> bool:
        """gmlx writes the tools into the prompt itself (the template gets none)."""
        return self.source == "json"


def template_syntax(template: ChatTemplate) -> ToolSyntax | None:
    """The template's own tool-call syntax, or None."""
    if template in _INFERRED:
        return _INFERRED[template]
    syntax = _INFERRED[template] = infer_tool_syntax(template.text)
    if syntax is None:
        log.info("chat template (%s) defines no tool-call syntax: with tool_format auto or json gmlx writes "
                 "the tools into the system prompt and reads JSON calls", template.source)
    else:
        log.info("chat template (%s) defines the %s tool-call syntax (used unless the model's tool_format is json)",
                 template.source, syntax.name)
    return syntax


def plan_tools(inp: GenerationParams, template: ChatTemplate, setting: ToolFormatSetting) -> ToolPlan | None:
    """None when the reply holds no calls to parse (no tools, tool_choice none, a raw prompt, or a
    template without a syntax under `tool_format: template`)."""
    if not inp.offers_tools or inp.prompt is not None:
        return None
    own = template_syntax(template)
    if setting == "json" or (setting == "auto" and own is None):
        return ToolPlan(GMLX_JSON, "json")
    return ToolPlan(own, "template") if own is not None else None


_ENUM_KEPT = 8  # an enum of up to this many values stays in a compact parameter


def _first_sentence(text: Any, limit: int = 160) -> str:
    if not isinstance(text, str):
        return ""
    line = text.strip().split("\n", 1)[0]
    end = line.find(". ")
    sentence = line[: end + 1] if end >= 0 else line
    return sentence if len(sentence) <= limit else sentence[: limit - 1].rstrip() + "…"


def _compact_schema(schema: Any) -> dict[str, Any]:
    if not isinstance(schema, Mapping):
        return {}
    out = {k: schema[k] for k in ("type",) if k in schema}
    enum = schema.get("enum")
    if isinstance(enum, list) and len(enum) <= _ENUM_KEPT:
        out["enum"] = enum
    return out


def compact_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A tool for a small window: its name, its description's first sentence, its top-level parameters with their
    types (and enums of up to 8 values) and which are required; parameter descriptions, nested schemas,
    defaults and examples are dropped."""
    fn = function_of(tool)
    raw, params, props = fn.get("parameters"), {}, {}
    if isinstance(raw, Mapping):
        params = dict(raw)
        props = dict(raw["properties"]) if isinstance(raw.get("properties"), Mapping) else {}
    short: dict[str, Any] = {"type": "object", "properties": {k: _compact_schema(v) for k, v in props.items()}}
    if isinstance(params.get("required"), list):
        short["required"] = params["required"]
    out = {"name": fn.get("name"), "description": _first_sentence(fn.get("description")), "parameters": short}
    return {"type": "function", "function": {k: v for k, v in out.items() if v != ""}}


_COMPACTED: set[str] = set()  # models whose compact rendering was logged


def note_compact(model: str, tools: int, full: int, compact: int, share: float, budget: int) -> None:
    """Said once per model: which tools' parts a small window leaves out of the prompt."""
    if model in _COMPACTED:
        return
    _COMPACTED.add(model)
    log.info("model %s: %d tools take %d tokens in full, over %.0f%% of its %d-token window (tool_prompt_budget); "
             "rendered compactly in %d tokens: names, first sentences, top-level parameters with types and "
             "required flags; parameter descriptions, nested schemas, defaults and examples dropped (the grammar "
             "still holds calls to the full schemas)", model, tools, full, share * 100, budget, compact)


def chosen_function(choice: str | Mapping[str, Any] | None) -> str | None:
    """The function a named tool_choice names ({"type": "function", "function": {"name": ...}}), else None."""
    fn = choice.get("function") if isinstance(choice, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    return name if isinstance(name, str) else None


def _signature(tool: Mapping[str, Any]) -> str:
    fn = function_of(tool)
    keep = {k: fn[k] for k in ("name", "description", "parameters") if k in fn}
    return json.dumps(keep, ensure_ascii=False)


def _choice_line(choice: str | Mapping[str, Any] | None) -> str:
    name = chosen_function(choice)
    if name is not None:
        return f"You must call the function {json.dumps(name)} now."
    if choice == "required":
        return "You must call one of these functions now."
    return "If none of them helps, answer in plain text instead."


def tool_block(tools: Sequence[Mapping[str, Any]], choice: str | Mapping[str, Any] | None) -> str:
    """The system-prompt block that describes the functions and gmlx's call form."""
    open_, close = GMLX_JSON.starts[0], GMLX_JSON.end
    return "\n".join([
        "# Tools", "",
        "You can call functions. Each one is described by a JSON object:",
        *(_signature(t) for t in tools), "",
        "To call a function, reply with one call in exactly this form, and nothing after it:",
        open_, '{"name": "<function name>", "arguments": {<the arguments as a JSON object>}}', str(close),
        "The function's result comes back in a <tool_response></tool_response> block.",
        _choice_line(choice),
    ])


def prompted_messages(messages: Sequence[Message], tools: Sequence[Mapping[str, Any]],
                      choice: str | Mapping[str, Any] | None) -> list[Message]:
    """The conversation with gmlx's tool block in its system message (one is added when it has none)."""
    out = plain_tool_turns(messages)
    block = tool_block(tools, choice)
    if out and out[0].get("role") in ("system", "developer"):
        return [{**out[0], "content": join_contents(out[0].get("content"), block)}, *out[1:]]
    return [{"role": "system", "content": block}, *out]
