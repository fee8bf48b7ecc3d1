"""A request's reasoning: the thinking block its template teaches, the budget its reasoning_effort buys, and
how the protocol layer is to read the block out of the reply (config `reasoning_format`, `reasoning_budgets`)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import replace

from gmlx_server.config.settings import DEFAULT_REASONING_BUDGETS, ModelEntry
from gmlx_server.engine.thinking import ReasoningSyntax, ReasoningUse, infer_reasoning
from gmlx_server.engine.types import ChatTemplate, GenerationRequest
from gmlx_server.generation_params import GenerationParams
from gmlx_server.serving.request_log import RequestRecord
from gmlx_server.serving.telemetry import Telemetry


@functools.lru_cache(maxsize=64)
def _syntax_of(template_text: str) -> ReasoningSyntax | None:
    return infer_reasoning(template_text)


def reasoning_syntax(template: ChatTemplate) -> ReasoningSyntax | None:
    """The template's thinking block (None: it teaches none); inferred once per template text."""
    return _syntax_of(template.text)


def with_effort_budget(inp: GenerationParams, entry: ModelEntry, template: ChatTemplate) -> GenerationParams:
    """reasoning_effort low/medium/high as a thinking_budget, unless the request set one. The model's
    `reasoning_budgets` always apply; the defaults only where the template thinks and does not read the
    effort itself (gpt-oss's does)."""
    effort = inp.reasoning_effort
    if inp.thinking_budget is not None or effort is None or reasoning_syntax(template) is None:
        return inp
    configured: Mapping[str, int | None] = entry.reasoning_budgets or {}
    if effort in configured:
        budget = configured[effort]
    elif "reasoning_effort" in template.variables:
        return inp
    else:
        budget = DEFAULT_REASONING_BUDGETS.get(effort)
    return inp if budget is None else replace(inp, thinking_budget=budget)


def reasoning_use(entry: ModelEntry, syntax: ReasoningSyntax | None, request: GenerationRequest,
                  telemetry: Telemetry, record: RequestRecord | None = None) -> ReasoningUse | None:
    """How the reply's thinking block is read: split out (parsed), or None: left in the text (raw, or a
    template without one)."""
    if syntax is None or entry.reasoning_format == "raw":
        return None
    model_id = entry.id

    def report(tokens: int) -> None:
        telemetry.record_reasoning(model_id, tokens)
        if record is not None:
            record.reasoning_tokens = tokens

    return ReasoningUse(syntax, request.starts_in_thinking, report)
