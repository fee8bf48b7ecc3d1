"""Tool-call syntaxes as data: how a call opens and ends, which chat template teaches which, and gmlx's own
JSON convention for templates that teach none.

Pure data and string matching (no MLX, no llguidance): the service renders prompts and grammars from a
syntax, the protocol layer parses replies with the parser it keeps for each syntax name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

ToolSource = Literal["template", "json"]  # who taught the model the syntax: its chat template, or gmlx


@dataclass(frozen=True)
class ToolSyntax:
    """One tool-call syntax: the markers that open a call, the one that closes it, and the body's shape."""

    name: str
    starts: tuple[str, ...]  # markers that open a call
    end: str | None  # marker that closes it; None: the body ends with its JSON value
    stop: tuple[str, ...] = ()  # extra stop strings while tools are on (text the model writes after its calls)
    leading_json: bool = False  # a message (or the gap after a call) that starts with '{' is a call
    # The key of a JSON body {"name": ..., KEY: {...}}; None: the body is not one JSON object per call, and
    # decoding cannot be constrained to it.
    args_key: str | None = None
    newlines: bool = False  # the body sits on its own line between the markers (Hermes' layout)


HERMES = ToolSyntax("hermes", ("<tool_call>",), "</tool_call>", args_key="arguments", newlines=True)
QWEN3_CODER = ToolSyntax("qwen3_coder", ("<tool_call>",), "</tool_call>")
LLAMA3_JSON = ToolSyntax("llama3_json", ("<|python_tag|>",), None, leading_json=True, args_key="parameters")
MISTRAL = ToolSyntax("mistral", ("[TOOL_CALLS]",), None)
# FunctionGemma goes on to imagine the tool's response; its model card makes that marker a stop sequence.
FUNCTIONGEMMA = ToolSyntax("functiongemma", ("<start_function_call>",), "<end_function_call>",
                           stop=("<start_function_response>",))
GEMMA4 = ToolSyntax("gemma4", ("<|tool_call>",), "<tool_call|>")
GEMMA_TOOL_CODE = ToolSyntax("gemma_tool_code", ("```tool_code",), "```")
# gmlx's convention for templates without a syntax of their own: Hermes' layout, which many small models
# have seen in training, described to the model in a system-prompt block (serving/tool_prompt.py).
GMLX_JSON = ToolSyntax("json", ("<tool_call>",), "</tool_call>", args_key="arguments", newlines=True)

# First match wins; each entry is an OR of AND-groups of template substrings.
_RULES: tuple[tuple[ToolSyntax, tuple[tuple[str, ...], ...]], ...] = (
    (GEMMA4, (("<|tool_call>",),)),
    (FUNCTIONGEMMA, (("<start_function_call>",),)),
    (QWEN3_CODER, (("<tool_call>", "<function="),)),
    (HERMES, (("<tool_call>",),)),
    (MISTRAL, (("[TOOL_CALLS]",),)),
    (LLAMA3_JSON, (("<|python_tag|>",), ("<|start_header_id|>", '"parameters"'))),
    (GEMMA_TOOL_CODE, (("tool_code",),)),
)
SYNTAXES: dict[str, ToolSyntax] = {s.name: s for s, _ in _RULES} | {GMLX_JSON.name: GMLX_JSON}


def infer_tool_syntax(template_source: str) -> ToolSyntax | None:
    """The call syntax a chat template teaches, or None: the template defines no tool calls."""
    for syntax, groups in _RULES:
        if any(all(marker in template_source for marker in group) for group in groups):
            return syntax
    return None


@dataclass(frozen=True)
class ToolUse:
    """How one request's reply carries tool calls: the syntax to parse, whether decoding was constrained to
    it, and where the parser reports its outcome (calls parsed, call texts that failed to parse)."""

    syntax: ToolSyntax
    source: ToolSource
    constrained: bool = False
    report: Callable[[int, int], None] | None = None
