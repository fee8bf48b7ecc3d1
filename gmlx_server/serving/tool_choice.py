"""tool_choice enforced: `required` and a named function hold the reply to a valid call with llguidance, and
`auto` under gmlx's own JSON convention lets the model write text or one valid call. Where a reply cannot
be constrained it is parsed leniently, and a forced choice says why in the log.

What each reply's parser found is reported to telemetry (and the request log) through the ToolUse.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gmlx_server.engine.tool_syntax import ToolSyntax, ToolUse
from gmlx_server.engine.types import Engine, ThinkingControl, Tokenizer
from gmlx_server.errors import InvalidRequest
from gmlx_server.generation_params import GenerationParams
from gmlx_server.serving.telemetry import Telemetry
from gmlx_server.serving.tool_prompt import ToolPlan, chosen_function

if TYPE_CHECKING:
    from gmlx_server.engine.types import CompiledGrammar
    from gmlx_server.serving.request_log import RequestRecord

log = logging.getLogger("gmlx.tools")


def _offered(tools: Any) -> set[str]:
    fns = [t.get("function") for t in tools or () if isinstance(t, Mapping)]
    return {fn["name"] for fn in fns if isinstance(fn, Mapping) and isinstance(fn.get("name"), str)}


def check_choice(inp: GenerationParams) -> str | None:
    """The function a named tool_choice names, which must be offered (400 otherwise)."""
    name = chosen_function(inp.tool_choice)
    if name is not None and inp.offers_tools and name not in _offered(inp.tools):
        raise InvalidRequest(f"'tool_choice': names the function {name!r}, which 'tools' does not offer",
                             param="tool_choice")
    return name


def _why_not(plan: ToolPlan, forced: bool, engine: Engine, thinking: ThinkingControl | None) -> str | None:
    """Why this reply is parsed rather than constrained, or None: it is constrained."""
    if not forced and plan.source == "template":
        return "auto with the template's own syntax is parsed, not constrained"
    if plan.syntax.args_key is None:
        return f"the template's {plan.syntax.name} syntax cannot be held to a grammar"
    if engine.info.drafts:
        return "a model with a speculative drafter cannot take a grammar"
    if thinking is not None:
        return "the reply starts by thinking, which a call grammar would forbid"
    return None


def special_markers(syntax: ToolSyntax, tokenizer: Tokenizer) -> dict[str, int]:
    """Markers that are one special token (Llama 3's <|python_tag|>): the grammar names them by id."""
    special = tokenizer.special_ids
    out = {}
    for marker in (*syntax.starts[:1], *((syntax.end,) if syntax.end else ())):
        ids = tokenizer.encode(marker, False)
        if len(ids) == 1 and ids[0] in special:
            out[marker] = ids[0]
    return out


async def constrain_tools(plan: ToolPlan | None, inp: GenerationParams, engine: Engine,
                          thinking: ThinkingControl | None, stops: Sequence[str] = ()) -> CompiledGrammar | None:
    """The reply's call grammar, or None (no tools, a response_format, or a reply that is only parsed).
    A whitespace stop string (a one-line profile's "\n") would cut a call laid out on lines: it is held
    to one line then."""
    name = check_choice(inp)
    if plan is None or inp.output_format is not None:
        return None
    forced = name is not None or inp.tool_choice == "required"
    why = _why_not(plan, forced, engine, thinking)
    if why is not None:
        if forced:
            log.warning("tool_choice %s is not enforced (%s): the reply is parsed as it comes", inp.tool_choice, why)
        return None
    from gmlx_server.engine.structured import StructuredOutputError  # llguidance: loaded when a request needs it
    from gmlx_server.engine.tool_grammar import compile_tool_grammar

    choice = name or ("required" if forced else "auto")
    syntax = plan.syntax
    if syntax.newlines and any(not s.strip() for s in stops):
        syntax = dataclasses.replace(syntax, newlines=False)
    special = special_markers(syntax, engine.tokenizer)
    try:
        return await asyncio.to_thread(compile_tool_grammar, syntax, inp.tools or (), choice, special)
    except StructuredOutputError as e:
        raise InvalidRequest(f"'{e.param}': {e}", param=e.param) from None


def tool_use(telemetry: Telemetry, model_id: str, plan: ToolPlan | None, grammar: CompiledGrammar | None,
             record: RequestRecord | None = None) -> ToolUse | None:
    """What the protocol layer needs to read the reply's calls, and where it reports what it found."""
    if plan is None:
        return None
    constrained = grammar is not None and grammar.kind == "tool_call"

    def report(parsed: int, failed: int) -> None:
        telemetry.record_tools(model_id, parsed, failed, constrained)
        if record is not None:
            record.tool_calls, record.tool_parser = parsed, plan.syntax.name

    return ToolUse(plan.syntax, plan.source, constrained, report)
