"""The generation request: what every protocol parser and `gmlx run` produce and the service consumes.

It sits below both the protocol and the service layer (which never import each other), so one type serves
both sides; it imports nothing of the server. Copies with other fields are `dataclasses.replace(params, ...)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

FormatKind = Literal["json_schema", "json_object", "regex", "choice", "grammar"]


@dataclass(frozen=True)
class ImageRef:
    """An image part as the client sent it, before anything is fetched or decoded: a message's content then
    holds {"type": "image", "image": ImageRef} among its {"type": "text"} parts."""

    param: str  # where it sat in the body (messages[0].content[1]), for the 400 that names it
    url: str | None = None  # an http(s) URL to fetch
    data: bytes | None = None  # the bytes of a base64 data URI or source
    media_type: str | None = None  # as declared (data URI, Anthropic media_type); None for a URL
    detail: str | None = None  # OpenAI's low/high/auto: accepted; the model family's processor sets the size


@dataclass(frozen=True)
class OutputFormat:
    """A structured-output request, shape-checked by the protocol layer and not yet compiled: the service compiles
    it (serving/output_format.py) before the model is asked for anything, so a bad one is still a 400."""

    kind: FormatKind
    source: str  # the field that carried it (response_format, text.format, structured_outputs, grammar)
    param: str  # where its payload sits (response_format.json_schema.schema), named by the 400 on a bad one
    schema: Mapping[str, Any] | None = None  # json_schema, json_object
    pattern: str | None = None  # regex
    choices: tuple[str, ...] = ()  # choice
    grammar: str | None = None  # grammar: llguidance's Lark, or GBNF as llama-server takes it


@dataclass(frozen=True)
class GenerationParams:
    """One generation request, protocol-free; `prompt` set means raw text, no chat template."""

    model: str = ""
    profile: str | None = None
    messages: tuple[dict[str, Any], ...] = ()
    prompt: str | None = None
    tools: tuple[dict[str, Any], ...] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True  # False: at most one call in the reply (the first)
    sampling: Mapping[str, Any] = field(default_factory=dict)  # explicit fields only
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    add_generation_prompt: bool = True  # False only from the tokenizer routes: the prompt ends after the last turn
    enable_thinking: bool | None = None
    thinking_budget: int | None = None
    reasoning_effort: str | None = None
    stream: bool = False
    priority: int | None = None  # lower is served sooner and shed later; None: the profile's, else normal (0)
    keep_alive_s: float | None = None  # the model's lifetime after this request (inf: no end); None: leave it as is
    include_usage: bool = False
    timings_per_token: bool = False
    output_format: OutputFormat | None = None  # structured output; the service compiles it
    ignored: tuple[str, ...] = ()
    messages_param: str = "messages"  # what the protocol calls the conversation, for errors (Responses: input)

    @property
    def offers_tools(self) -> bool:
        """Tools reach the template (tool_choice none strips them), so the reply may hold calls."""
        return bool(self.tools) and self.tool_choice != "none"
