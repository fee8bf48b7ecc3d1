"""Start one generation: address -> engine -> template -> tokens -> context check -> submit.

Rendering and tokenizing run in a worker thread, never on the event loop: the template is pure Python
(the GIL switches every 5 ms) and long texts tokenize without the GIL, so /health answers whatever a
prompt holds. Nothing here calls MLX. The input is GenerationParams (gmlx_server/generation_params.py),
whichever protocol parser or `gmlx run` built it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gmlx_server.engine.draft_policy import refusal, unsupported_sampling
from gmlx_server.engine.thinking import THINK, ReasoningSyntax, ReasoningUse
from gmlx_server.engine.types import (
    ChatTemplate,
    Engine,
    GenerationRequest,
    RequestHandle,
    SamplingParams,
    ThinkingControl,
    TokenEvent,
    Tokenizer,
)
from gmlx_server.errors import ContextOverflow, GmlxError, InvalidRequest, UnsupportedFeature
from gmlx_server.generation_params import GenerationParams
from gmlx_server.serving.addressing import Settings, merge_sampling, resolve_address, resolve_settings
from gmlx_server.serving.cache_points import request_hints
from gmlx_server.serving.fair_share import Released
from gmlx_server.serving.image_fetch import ImagePolicy
from gmlx_server.serving.model_host import ModelHost
from gmlx_server.serving.output_format import compile_format
from gmlx_server.serving.reasoning import reasoning_syntax, reasoning_use, with_effort_budget
from gmlx_server.serving.request_log import OutputCap
from gmlx_server.serving.roles import REPAIRS
from gmlx_server.serving.tool_choice import constrain_tools, tool_use
from gmlx_server.serving.tool_prompt import ToolPlan, note_compact, plan_tools, prompted_messages
from gmlx_server.serving.vision import PromptImages, prompt_images

if TYPE_CHECKING:
    from gmlx_server.engine.tool_syntax import ToolUse
    from gmlx_server.engine.types import CompiledGrammar
    from gmlx_server.engine.vision.prompt import VisionPrompt
    from gmlx_server.serving.request_log import RequestRecord

log = logging.getLogger("gmlx.generate")
MAX_MESSAGES = 100_000  # per request: bounds the template's work before it starts


@dataclass(frozen=True)
class Started:
    """A submitted request: iterate `handle` for TokenEvents; `cancel()` it if the client leaves."""

    handle: RequestHandle
    model_id: str
    profile: str | None
    prompt_tokens: int
    max_tokens: int
    tokenizer: Tokenizer
    tools: ToolUse | None  # how the reply's tool calls are parsed (None: the reply is text)
    requested_max_tokens: int | None = None  # set when the clamp lowered the client's max_tokens
    reasoning: ReasoningUse | None = None  # how the reply's thinking block is read (None: it stays text)


def thinking_variables(inp: GenerationParams, variables: frozenset[str]) -> dict[str, Any]:
    """enable_thinking / reasoning_effort / thinking_budget, only where the template reads them."""
    enable, effort, budget = inp.enable_thinking, inp.reasoning_effort, inp.thinking_budget
    if enable is None and effort is not None:
        enable = effort not in ("none", "minimal")
    if enable is None and budget == 0:
        enable = False
    values = {"enable_thinking": enable, "reasoning_effort": effort, "thinking_budget": budget}
    return {k: v for k, v in values.items() if v is not None and k in variables}


def template_variables(inp: GenerationParams, settings: Settings, template: ChatTemplate) -> dict[str, Any]:
    """Profile kwargs < request chat_template_kwargs < the dedicated thinking/tool fields."""
    values = dict(settings.template_kwargs)
    values.update(inp.template_kwargs)
    values.update(thinking_variables(inp, template.variables))
    forced = isinstance(inp.tool_choice, dict) or inp.tool_choice == "required"
    if forced and "tool_choice" in template.variables:
        values["tool_choice"] = inp.tool_choice
    for reserved in ("messages", "tools", "add_generation_prompt"):
        values.pop(reserved, None)  # these are render()'s own arguments
    return values


def render_chat(inp: GenerationParams, settings: Settings, template: ChatTemplate,
                tools: ToolPlan | None = None) -> str:
    return render_messages(inp, settings, template, tools)[0]


def render_messages(inp: GenerationParams, settings: Settings, template: ChatTemplate,
                    plan: ToolPlan | None = None) -> tuple[str, str | None]:
    """The rendered prompt, and what was repaired when the template refused the messages as sent."""
    messages = list(inp.messages)
    if settings.system and (not messages or messages[0].get("role") != "system"):
        messages.insert(0, {"role": "system", "content": settings.system})  # a request's own system wins
    tools: Sequence[Mapping[str, Any]] | None = None if inp.tool_choice == "none" or not inp.tools else inp.tools
    if tools is not None and plan is not None:  # (tool_choice none is enforced by stripping the tools)
        tools = plan.rendered(tools)
    if plan is not None and plan.prompted:  # gmlx's own tool prompt: the template sees plain turns
        messages, tools = prompted_messages(messages, plan.rendered(inp.tools or ()), inp.tool_choice), None

    def render(msgs: list[dict[str, Any]]) -> str:
        return template.render(msgs, tools=list(tools) if tools else None,
                               add_generation_prompt=inp.add_generation_prompt,
                               **template_variables(inp, settings, template))

    try:
        return render(messages), None
    except Exception as exc:  # template raise_exception(...) and jinja errors are about the request
        refused = exc
    for what, repair in REPAIRS:
        try:
            return render(repair(messages)), f"{what}: the template refused them as sent ({refused})"
        except Exception:
            continue
    raise InvalidRequest(f"the chat template rejected the request: {refused}", param=inp.messages_param) from refused


def fit_context(prompt_tokens: int, explicit: int | None, profile_cap: int | None, budget: int,
                model: str, clamp: bool = False) -> OutputCap:
    """The output cap: an explicit one must fit the window (or, clamped, shrinks to what is left)."""
    room = budget - prompt_tokens
    if explicit is not None and prompt_tokens + explicit <= budget:
        return OutputCap(explicit)
    if explicit is not None and not (clamp and room >= 1):
        raise ContextOverflow(prompt_tokens, explicit, budget, model)
    if room < 1:
        raise ContextOverflow(prompt_tokens, 1, budget, model)
    if explicit is not None:
        return OutputCap(room, requested=explicit)
    return OutputCap(min(room, profile_cap) if profile_cap is not None else room)


def add_stops(own: tuple[str, ...], more: tuple[str, ...]) -> tuple[str, ...]:
    return own + tuple(s for s in more if s not in own)


def build_sampling(settings: Settings, inp: GenerationParams, vocab_size: int) -> SamplingParams:
    bad = [t for t in inp.logit_bias if t >= vocab_size]
    if bad:
        raise InvalidRequest(f"'logit_bias': token id {bad[0]} is outside the vocabulary (size {vocab_size})",
                             param="logit_bias")
    fields = merge_sampling(settings, inp.sampling)
    return SamplingParams(**fields, logit_bias=dict(inp.logit_bias))


class PromptTooLong(GmlxError):
    """Refused before tokenizing: the prompt cannot fit whatever its tokens. Agents match the prefix."""

    status, type = 400, "invalid_request_error"

    def __init__(self, detail: str, param: str = "messages", **extra: int) -> None:
        super().__init__(f"prompt is too long: {detail}", param=param, code="context_length_exceeded", extra=extra)


def check_message_count(inp: GenerationParams) -> None:
    n = len(inp.messages)
    if n > MAX_MESSAGES:
        raise PromptTooLong(f"{n} messages, more than the {MAX_MESSAGES} a request may hold", messages=n,
                            max_messages=MAX_MESSAGES)


def check_length(text: str, tokenizer: Tokenizer, model: str, budget: int, param: str = "messages") -> None:
    """No token spans more than max_token_chars characters, so a longer text cannot fit: say so untokenized."""
    per = tokenizer.max_token_chars
    least = -(-len(text) // per) if per else 0
    if least >= budget:  # as fit_context: at least one output token must fit
        raise PromptTooLong(f"{len(text)} characters need at least {least} tokens (no token of model '{model}' "
                            f"spans more than {per} characters), over the context window of {budget} tokens", param,
                            prompt_chars=len(text), min_prompt_tokens=least, context_budget=budget)


def tokenize(inp: GenerationParams, settings: Settings, template: ChatTemplate, tokenizer: Tokenizer,
             model: str, budget: int, tools: ToolPlan | None = None,
             images: PromptImages | None = None) -> tuple[str, list[int]]:
    """Render (or take the raw prompt), refuse what cannot fit, tokenize. Blocking: run it in a thread."""
    raw = inp.prompt is not None
    text, repaired = (inp.prompt, None) if inp.prompt is not None else render_messages(inp, settings, template,
                                                                                       tools)
    if images is not None:  # each image placeholder becomes its family's run of soft tokens
        text = images.expand(text)
    if repaired:
        log.info("model %s: %s", model, repaired)
    check_length(text, tokenizer, model, budget, "prompt" if raw else inp.messages_param)
    # A rendered chat template carries its own BOS; a raw completion prompt gets the tokenizer's.
    ids = tokenizer.encode(text, raw)
    if not ids:
        raise InvalidRequest("the prompt is empty", param="prompt" if raw else inp.messages_param)
    return text, ids


def fit_tools(inp: GenerationParams, settings: Settings, template: ChatTemplate, tokenizer: Tokenizer, model: str,
              budget: int, plan: ToolPlan | None, images: PromptImages | None,
              share: float) -> tuple[str, list[int], ToolPlan | None]:
    """tokenize(); where the rendered tools alone take more than `share` of the window (a model's
    tool_prompt_budget), once more with the tools rendered compactly (the grammar keeps the full schemas)."""
    text, ids = tokenize(inp, settings, template, tokenizer, model, budget, plan, images)
    if plan is None or len(ids) <= share * budget:
        return text, ids, plan
    bare = len(tokenize(replace(inp, tool_choice="none"), settings, template, tokenizer, model, budget, None,
                        images)[1])
    if len(ids) - bare <= share * budget:
        return text, ids, plan
    compact = replace(plan, compact=True)
    text, small = tokenize(inp, settings, template, tokenizer, model, budget, compact, images)
    note_compact(model, len(inp.tools or ()), len(ids) - bare, len(small) - bare, share, budget)
    return text, small, compact


@dataclass(frozen=True)
class Prompt:
    """A request's prompt as the model will see it: rendered (or raw) text and its token ids."""

    engine: Engine
    model_id: str
    settings: Settings
    text: str
    ids: list[int]
    tools: ToolPlan | None = None  # the syntax the reply's tool calls are read in
    vision: VisionPrompt | None = None  # its images, at their soft tokens in `ids`
    reasoning: ReasoningSyntax | None = None  # the template's thinking block
    grammar: CompiledGrammar | None = None  # the request's output format, compiled


def tool_plan(host: ModelHost, model_id: str, inp: GenerationParams, template: ChatTemplate) -> ToolPlan | None:
    """The request's tool syntax under its model's `tool_format`."""
    return plan_tools(inp, template, host.entry(model_id).tool_format)


async def prepare_prompt(host: ModelHost, inp: GenerationParams) -> Prompt:
    """Address -> engine -> template -> tokens: shared by generation and token counting, so both agree."""
    check_message_count(inp)  # before a model loads for it, as is the output format's compile
    grammar = await compile_format(inp.output_format)
    addr = resolve_address(inp.model, inp.profile, host.catalog)
    engine: Engine = await host.engine(addr.model_id)
    if inp.keep_alive_s is not None:  # the latest request's keep_alive or ttl sets the model's lifetime
        host.residency.keep_alive(addr.model_id, inp.keep_alive_s)
    settings = resolve_settings(addr, engine.info.family, host.catalog)
    inp = with_effort_budget(inp, host.entry(addr.model_id), engine.template)
    plan = tool_plan(host, addr.model_id, inp, engine.template)
    inp, images = await prompt_images(inp, engine.info.vision, addr.model_id, ImagePolicy.of(host.config.server))
    text, ids, plan = await asyncio.to_thread(fit_tools, inp, settings, engine.template, engine.tokenizer,
                                              addr.model_id, engine.info.context_length, plan, images,
                                              host.entry(addr.model_id).tool_prompt_budget)
    return Prompt(engine, addr.model_id, settings, text, ids, plan, images.bind(ids) if images is not None else None,
                  reasoning_syntax(engine.template) if inp.prompt is None else None,  # a raw prompt has no template
                  grammar)


async def count_prompt_tokens(host: ModelHost, inp: GenerationParams) -> tuple[str, int]:
    """(model id, exact prompt token count) without submitting anything."""
    prompt = await prepare_prompt(host, inp)
    return prompt.model_id, len(prompt.ids)


def default_cap(configured: int, prompt_tokens: int, budget: int) -> int:
    """A cap-less request's cap: default_max_tokens, at most half of what the window leaves after the prompt, so
    the conversation keeps as much room again for its next turn (as launch sizes a client)."""
    return max(1, min(configured, (budget - prompt_tokens) // 2))


def output_cap(host: ModelHost, prompt: Prompt, explicit: int | None, request_id: str) -> OutputCap:
    """The context fit: the explicit max_tokens, else the profile's, else default_cap, within the window."""
    budget, implicit = prompt.engine.info.context_length, prompt.settings.max_tokens
    if implicit is None:
        implicit = default_cap(host.config.default_max_tokens(prompt.model_id), len(prompt.ids), budget)
    cap = fit_context(len(prompt.ids), explicit, implicit, budget, prompt.model_id,
                      clamp=prompt.model_id in host.catalog.clamped)
    if cap.requested is not None:
        log.info("%s: max_tokens %d clamped to %d (%d prompt tokens, context window %d of model '%s')",
                 request_id, cap.requested, cap.max_tokens, len(prompt.ids), budget, prompt.model_id)
    return cap


def build_request(prompt: Prompt, inp: GenerationParams, request_id: str, cap: OutputCap, *,
                  top_logprobs_k: int, tool_grammar: CompiledGrammar | None = None) -> GenerationRequest:
    """The engine's request for a tokenized prompt, without prompt-cache points: no I/O, no await."""
    engine, settings, text = prompt.engine, prompt.settings, prompt.text
    thinking = thinking_control(inp, text, prompt.reasoning)
    opened = thinking is not None and text.rstrip().endswith(thinking.open_tag)
    sampling = build_sampling(settings, inp, engine.tokenizer.vocab_size)
    if engine.info.drafts:
        check_speculative(inp, settings, sampling)
    tool_stops = prompt.tools.syntax.stop if prompt.tools is not None else ()
    return GenerationRequest(
        request_id=request_id, prompt_tokens=prompt.ids, max_tokens=cap.max_tokens,
        sampling=sampling,
        stop=add_stops(add_stops(inp.stop, tool_stops), settings.stop),
        logprobs=inp.logprobs, top_logprobs=min(inp.top_logprobs, top_logprobs_k),
        thinking=thinking, starts_in_thinking=opened, grammar=prompt.grammar or tool_grammar, vision=prompt.vision,
        priority=request_priority(inp, settings),
    )


def request_priority(inp: GenerationParams, settings: Settings) -> int:
    """The engine queue's order (lower goes sooner): the request's own priority, else its profile's."""
    return inp.priority if inp.priority is not None else settings.priority or 0


@dataclass(frozen=True)
class Prepared:
    """A request ready for the engine: its prompt, output cap and the GenerationRequest itself."""

    prompt: Prompt
    cap: OutputCap
    request: GenerationRequest


async def prepare_request(host: ModelHost, inp: GenerationParams, request_id: str) -> Prepared:
    """Every refusal but admission's: the server submits the result, `gmlx run` generates it in the terminal."""
    prompt = await prepare_prompt(host, inp)
    inp = with_effort_budget(inp, host.entry(prompt.model_id), prompt.engine.template)  # as the prompt saw it
    cap = output_cap(host, prompt, inp.max_tokens, request_id)
    grammar = await constrain_tools(prompt.tools, inp, prompt.engine,
                                    thinking_control(inp, prompt.text, prompt.reasoning),
                                    stops=(*inp.stop, *prompt.settings.stop))
    request = build_request(prompt, inp, request_id, cap, top_logprobs_k=host.env.top_logprobs_k,
                            tool_grammar=grammar)
    render = functools.partial(render_chat, tools=prompt.tools)  # the cache's probes render as the prompt did
    hints = await request_hints(inp, prompt.settings, prompt.engine, prompt.ids, render, host.token_memo)
    pinned = inp.max_tokens if cap.requested is None else cap.max_tokens
    host.capacity.preflight(prompt.model_id, len(prompt.ids), pinned)  # memory 400 before any prefill
    return Prepared(prompt, cap, replace(request, **hints))


async def start_generation(host: ModelHost, inp: GenerationParams, request_id: str,
                           record: RequestRecord | None = None) -> Started:
    """Everything that can refuse the request happens here, before a byte of response is sent; `record`
    (the request log's line) learns what the request became, and names its caller."""
    if record is not None:  # what the client asked for, until the model is resolved
        record.request_id, record.model = request_id, inp.model or None
    prep = await prepare_request(host, inp, request_id)
    prompt, engine = prep.prompt, prep.prompt.engine
    if record is not None:
        record.started(prompt.model_id, prompt.settings.profile, len(prompt.ids), prep.cap, prompt.text)
    caller = record.caller if record is not None else None
    release = await host.shares.enter(caller, prep.request.priority, lambda: host.admission.eta_s(
        prompt.model_id, engine.stats())) if caller is not None else None
    try:
        handle = _submit(host, prep, record)
    except BaseException:
        if release is not None:
            release()
        raise
    tools = tool_use(host.telemetry, prompt.model_id, prompt.tools, prep.request.grammar, record)
    reasoning = reasoning_use(host.entry(prompt.model_id), prompt.reasoning, prep.request, host.telemetry, record)
    return Started(handle if release is None else Released(handle, release), prompt.model_id,
                   prompt.settings.profile, len(prompt.ids), prep.cap.max_tokens, engine.tokenizer, tools,
                   prep.cap.requested, reasoning)


def _submit(host: ModelHost, prep: Prepared, record: RequestRecord | None) -> RequestHandle:
    """host.start admits, submits and tracks; the caller's label joins the live requests once the engine took it
    (its events reach this loop only after we return, so the final one cannot come first)."""
    caller = record.caller if record is not None else None

    def finished(ev: TokenEvent) -> None:
        if record is not None:
            record.finished(ev)
        if caller is not None:
            host.telemetry.callers.pop(prep.request.request_id, None)
            if ev.timings is not None:
                host.telemetry.keys.used(caller.label, ev.timings.prompt_tokens, ev.timings.generated)

    handle = host.start(prep.prompt.model_id, prep.prompt.engine, prep.request, finished)
    if caller is not None:
        host.telemetry.callers[prep.request.request_id] = caller.label
    if record is not None:
        record.submitted()  # its line now waits for the final event, even when the client leaves first
    return handle


def check_speculative(inp: GenerationParams, settings: Settings, sampling: SamplingParams) -> None:
    """A speculative model honours only what its rounds can (engine/draft_policy.py): a grammar or any other
    request-level logits processor is a 400 naming the field and who set it."""
    if inp.output_format is not None:
        source = inp.output_format.source
        raise UnsupportedFeature(f"'{source}': {refusal('grammar', source)}", param=source)
    refused = unsupported_sampling(sampling)
    if refused:
        name = refused[0]
        source = ("the request" if name == "logit_bias" or name in inp.sampling else
                  f"profile '{settings.profile}'" if settings.profile else "the model family's defaults")
        raise UnsupportedFeature(f"'{name}': {refusal(name, source)}", param=name)


def thinking_control(inp: GenerationParams, text: str,
                     syntax: ReasoningSyntax | None = None) -> ThinkingControl | None:
    """A budget, or a prompt that already opened a thinking block, makes the engine track thinking (in the
    template's tags; `<think>` where it teaches none)."""
    control = (syntax or THINK).control(inp.thinking_budget)
    if inp.thinking_budget is not None or (inp.prompt is None and text.rstrip().endswith(control.open_tag)):
        return control
    return None
