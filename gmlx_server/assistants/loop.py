"""The tool loop behind an assistant id: model turn -> parse its calls -> run the allowlisted ones through
MCP -> feed the results back through the model's chat template -> the next turn, until a turn answers
without a call or `max_steps` tool rounds ran (the answer then says it stopped).

Each turn is an ordinary generation request (serving/generation.py's start_generation, under the request's
id): addressing, the template, the context fit, admission and telemetry are the model's own. The first turn
starts before the route sends a byte, so it refuses like any request; the loop then runs as the handle the
route streams. Visible text streams as it comes, every turn's; a call's markup never does. Each finished
call is recorded in the trace, which the route's encoder shows (gmlx_server/assistants/trace.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gmlx_server.assistants.registry import Assistants
from gmlx_server.assistants.toolbox import Toolbox, ToolOutcome
from gmlx_server.assistants.turns import Call, TurnReader
from gmlx_server.engine.types import TokenEvent
from gmlx_server.errors import InvalidRequest
from gmlx_server.generation_params import GenerationParams
from gmlx_server.serving.generation import Started, start_generation
from gmlx_server.serving.model_host import ModelHost

if TYPE_CHECKING:
    from gmlx_server.config.assistant_entries import Assistant
    from gmlx_server.serving.request_log import RequestRecord

log = logging.getLogger("gmlx.assistants")
TICK = TokenEvent("", None)  # an empty event: the encoder gets to show the trace's new steps now


@dataclass
class Trace:
    """The loop's finished calls, in order; the encoder takes the ones it has not shown yet."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    shown: int = 0

    def unshown(self) -> list[dict[str, Any]]:
        new, self.shown = self.steps[self.shown:], len(self.steps)
        return new


@dataclass(frozen=True)
class AssistantStarted(Started):
    trace: Trace = field(default_factory=Trace)


async def start_reply(host: ModelHost, assistants: Assistants | None, params: GenerationParams, request_id: str,
                      record: RequestRecord | None = None) -> Started:
    """A chat, messages or responses request: the tool loop when `model` names an assistant, else the model."""
    entry = assistants.entry(params.model) if assistants is not None and params.model else None
    if assistants is None or entry is None:
        return await start_generation(host, params, request_id, record)
    check_request(entry, params)
    loop = ToolLoop(host, assistants, await assistants.toolbox(entry), params, request_id, record)
    return await loop.start()


def check_request(entry: Assistant, params: GenerationParams) -> None:
    """What an assistant cannot honour is refused by name: its tools are the config's, its turns are parsed."""
    if params.tools:
        raise InvalidRequest(f"'tools': assistant '{entry.id}' runs its own tools (its config's allowlist); a "
                             "request to it cannot add tools. Send your tools to a model id instead", param="tools")
    choice = params.tool_choice
    if isinstance(choice, dict) or choice == "required":
        raise InvalidRequest(f"'tool_choice': assistant '{entry.id}' takes auto or none (its model decides when "
                             "to call a tool)", param="tool_choice")
    if params.logprobs:
        raise InvalidRequest(f"'logprobs': not available from assistant '{entry.id}' (its answer spans several "
                             "model turns)", param="logprobs")
    if params.output_format is not None:
        source = params.output_format.source
        raise InvalidRequest(f"'{source}': not available from assistant '{entry.id}' (its turns must be free to "
                             "call tools)", param=source)


def with_system(system: str | None, messages: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], ...]:
    """The assistant's system prompt first; a request's own system text follows it in the same message."""
    if not system:
        return messages
    first = messages[0] if messages else None
    if first is not None and first.get("role") == "system" and isinstance(first.get("content"), str):
        return ({**first, "content": f"{system}\n\n{first['content']}"}, *messages[1:])
    return ({"role": "system", "content": system}, *messages)


class ToolLoop:
    def __init__(self, host: ModelHost, assistants: Assistants, box: Toolbox, params: GenerationParams,
                 request_id: str, record: RequestRecord | None) -> None:
        self.host, self.assistants, self.box, self.record = host, assistants, box, record
        self.entry, self.request_id = box.entry, request_id
        self.budget = params.max_tokens  # the whole answer's output cap, across turns
        self.inp = replace(params, model=box.entry.model, tools=box.model_tools() or None,
                           messages=with_system(box.entry.system, params.messages))
        self.choice = params.tool_choice  # later turns: the client's auto or none
        self.trace = Trace()
        self.step = 1
        self.generated = 0
        self.shown = False  # text reached the client: a later turn's text starts after a blank line
        self._turn_shown = False
        self._turn: Started | None = None
        self._task: asyncio.Future[ToolOutcome] | None = None

    def _first_turn(self) -> GenerationParams:
        """The config's `tool_choice: required` holds the first turn to a call, unless the client said none."""
        if self.entry.tool_choice == "required" and self.choice != "none":
            return replace(self.inp, tool_choice="required")
        return self.inp

    async def start(self) -> AssistantStarted:
        self._turn = first = await start_generation(self.host, self._first_turn(), self.request_id, self.record)
        return AssistantStarted(LoopHandle(self), self.entry.id, first.profile, first.prompt_tokens,
                                first.max_tokens, first.tokenizer, None, first.requested_max_tokens, trace=self.trace)

    def cancel(self) -> None:
        if self._turn is not None:
            self._turn.handle.cancel()
        if self._task is not None:
            self._task.cancel()

    def _mark(self, state: str, tool: str | None = None) -> None:
        """The live row /v1/metrics shows for this request (its engine rows and the assistants section)."""
        self.assistants.active[self.request_id] = {"assistant": self.entry.id, "step": self.step,
                                                   "max_steps": self.entry.max_steps, "state": state, "tool": tool}

    async def events(self) -> AsyncIterator[TokenEvent]:
        self._mark("model")  # here, not at start: the row goes when this generator ends
        try:
            while self._turn is not None:
                reader = TurnReader(self._turn.tools, self.inp.tools)
                final = None
                async for ev in self._turn.handle:
                    text = reader.feed(ev.text)
                    if ev.finish_reason is not None:
                        text, final = text + reader.finish(), ev
                    if text:
                        yield self._visible(text)
                if final is None:
                    return
                if final.timings is not None:
                    self.generated += final.timings.generated
                async for ev in self._after(reader, final):
                    yield ev
        finally:
            self.assistants.active.pop(self.request_id, None)

    def _visible(self, text: str) -> TokenEvent:
        if self.shown and not self._turn_shown:
            text = f"\n\n{text}"
        self.shown = self._turn_shown = True
        return TokenEvent(text, None)

    async def _after(self, reader: TurnReader, final: TokenEvent) -> AsyncIterator[TokenEvent]:
        """The turn ended: answer, stop, or run its calls and start the next turn (self._turn)."""
        self._turn, self._turn_shown = None, False
        if final.finish_reason != "stop" or not reader.calls:
            yield self._final(final, reader)
            return
        if self.step > self.entry.max_steps:
            yield self._visible(self._stopped(reader.calls))
            yield self._final(final, reader)
            return
        outcomes = []
        for call in reader.calls:
            outcomes.append(await self._run(call))
            yield TICK
        messages = (*self.inp.messages, reader.assistant_message(),
                    *({"role": "tool", "tool_call_id": o.call_id, "name": o.name, "content": o.content}
                      for o in outcomes))
        self.inp = replace(self.inp, messages=messages, max_tokens=self._left())
        if self.inp.max_tokens == 0:  # the answer's output cap is spent: it ends as a cut answer does
            yield self._final(replace(final, finish_reason="length"), reader)
            return
        self.step += 1
        self._turn = await start_generation(self.host, self.inp, self.request_id, self.record)
        self._mark("model")

    async def _run(self, call: Call) -> ToolOutcome:
        self._mark("tool", call.name)
        self._task = asyncio.ensure_future(self.box.run(self.step, call.call_id, call.name, call.arguments))
        try:
            outcome = await self._task
        finally:
            self._task = None
        self.trace.steps.append(outcome.trace())
        log.info("%s: assistant %s step %d: %s -> %s (%.3f s)", self.request_id, self.entry.id, self.step,
                 call.name, "ok" if outcome.error is None else outcome.error["type"], outcome.duration_s)
        return outcome

    def _left(self) -> int | None:
        return None if self.budget is None else max(self.budget - self.generated, 0)

    def _stopped(self, calls: list[Call]) -> str:
        """The step limit: the calls are recorded as not run, and the answer says why it ends here."""
        for c in calls:
            message = f"not run: assistant '{self.entry.id}' reached its limit of {self.entry.max_steps} tool steps"
            self.trace.steps.append(ToolOutcome(self.step, c.call_id, c.name, c.arguments, self.box.server_of.get(
                c.name), "", {"type": "step_limit", "message": message}, 0.0).trace())
        names = ", ".join(c.name for c in calls)
        return (f"[stopped: assistant '{self.entry.id}' reached its limit of {self.entry.max_steps} tool steps; "
                f"the model's last calls were not run: {names}]")

    def _final(self, ev: TokenEvent, reader: TurnReader) -> TokenEvent:
        """The turn's final event with the whole answer's generated count (and no stop string of ours)."""
        timings = replace(ev.timings, generated=self.generated) if ev.timings is not None else None
        stop = None if ev.stop_string in reader.format_stops else ev.stop_string
        return replace(ev, text="", timings=timings, stop_string=stop)


class LoopHandle:
    """The loop as the route's request handle: iterate it for the answer's events, cancel() it if the client
    leaves (the running turn is cancelled, and so is a running tool call)."""

    def __init__(self, loop: ToolLoop) -> None:
        self.request_id = loop.request_id
        self._loop = loop

    def cancel(self) -> None:
        self._loop.cancel()

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self._loop.events()
