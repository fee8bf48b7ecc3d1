"""OpenAI Responses request bodies -> GenerationParams, the generation request (pure).

Input items become the chat template's messages: message items keep their role (developer ->
system), function_call items become the assistant's `tool_calls`, function_call_output items
`tool` messages. `instructions` is a system message for this request only: a conversation
continued through previous_response_id does not carry it over (OpenAI's rule).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gmlx_server.errors import UnsupportedFeature
from gmlx_server.generation_params import GenerationParams, OutputFormat
from gmlx_server.protocol import params as p
from gmlx_server.protocol.image_parts import parts_content, responses_image
from gmlx_server.protocol.openai import body_object, response_format, thinking_controls
from gmlx_server.protocol.output_fields import format_object, output_format
from gmlx_server.protocol.shared import merge_turns, name_tool_results, tool_call_entry, tool_function

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
_MEDIA_PARTS = ("input_image", "input_file", "input_audio")


@dataclass(frozen=True)
class ResponsesRequest:
    params: GenerationParams  # messages: instructions + this request's input, without the history
    input_messages: tuple[dict[str, Any], ...]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    echo: Mapping[str, Any] = field(default_factory=dict)  # request fields the response object repeats

    def with_history(self, history: Sequence[Mapping[str, Any]]) -> GenerationParams:
        """The generation request once the stored conversation of previous_response_id is known."""
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        turns = merge_turns([*history, *self.input_messages])
        return replace(self.params, messages=tuple(name_tool_results([*system, *turns])))


def _text(content: Any, where: str) -> str:
    """A string, or text parts (input_text, output_text, refusal) joined."""
    out = _content(content, where)
    assert isinstance(out, str)
    return out


def _content(content: Any, where: str, images: bool = False) -> str | list[dict[str, Any]]:
    """_text, and with `images` (user messages) input_image parts, which make it an ordered parts list."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise p.bad(where, f"expected a string or an array of content parts, got {p.json_type(content)}")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_image" and images:
            parts.append(responses_image(part, f"{where}[{j}]"))
            continue
        if kind in _MEDIA_PARTS:
            what = "accepted in user messages only" if kind == "input_image" else "not supported"
            raise UnsupportedFeature(f"'{where}[{j}]': {kind} parts are {what}", param=where)
        key = _TEXT_PARTS.get(kind) if isinstance(kind, str) else None
        if key is None or not isinstance(part.get(key), str):
            raise p.bad(f"{where}[{j}]", "expected an input_text or output_text part with a string")
        parts.append({"type": "text", "text": part[key]})
    return parts_content(parts)


def _item(i: int, item: Any) -> dict[str, Any] | None:
    where = f"input[{i}]"
    if not isinstance(item, dict):
        raise p.bad(where, f"expected an object, got {p.json_type(item)}")
    kind = item.get("type", "message")  # "easy" input messages carry no type
    if kind == "message":
        role = item.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise p.bad(f"{where}.role", f"expected user, assistant, system or developer, got {role!r}")
        return {"role": _ROLES[role], "content": _content(item.get("content"), f"{where}.content", role == "user")}
    if kind == "function_call":
        call = tool_call_entry(p.required_string(item, "call_id", where), p.required_string(item, "name", where),
                               p.required_string(item, "arguments", where), where)
        return {"role": "assistant", "content": "", "tool_calls": [call]}
    if kind == "function_call_output":
        output = _text(item.get("output"), f"{where}.output")
        return {"role": "tool", "tool_call_id": p.required_string(item, "call_id", where), "content": output}
    if kind == "reasoning":
        return _reasoning_item(item, where)
    raise UnsupportedFeature(f"'{where}': {kind!r} items are not supported (expected message, function_call, "
                             "function_call_output or reasoning)", param=where)


def _reasoning_item(item: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    """An earlier turn's reasoning, for templates that render it (reasoning_content); its reasoning_text parts,
    else its summary. Encrypted content is OpenAI's own: nothing a local model can read."""
    texts = []
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if parts is not None and not isinstance(parts, list):
            raise p.bad(f"{where}.{key}", f"expected an array of parts, got {p.json_type(parts)}")
        texts = [part["text"] for part in parts or () if isinstance(part, dict) and part.get("type") == kind
                 and isinstance(part.get("text"), str)]
        if texts:
            break
    return {"role": "assistant", "content": "", "reasoning_content": "\n".join(texts)} if texts else None


def _input(body: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    raw = body.get("input")
    if isinstance(raw, str):
        return ({"role": "user", "content": raw},)
    if raw is None:
        raise p.bad("input", "required: a string or an array of items")
    if not isinstance(raw, list):
        raise p.bad("input", f"expected a string or an array of items, got {p.json_type(raw)}")
    if not raw:
        raise p.bad("input", "must contain at least one item")
    return tuple(m for m in (_item(i, x) for i, x in enumerate(raw)) if m is not None)


def _tool(i: int, tool: Any) -> dict[str, Any] | None:
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise p.bad(where, f"expected an object, got {p.json_type(tool)}")
    if tool.get("type") != "function":
        return None  # hosted tools (web_search, ...) run on OpenAI's side: named in `ignored` (params.ignored_fields)
    params = p.nested(p.obj, tool, "parameters", f"{where}.parameters")
    return tool_function(p.required_string(tool, "name", where), tool.get("description"), params)


def _tool_choice(body: Mapping[str, Any]) -> str | dict[str, Any] | None:
    choice = body.get("tool_choice")
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise p.bad("tool_choice", 'expected none, auto, required or {"type": "function", "name": ...}')


def _text_format(body: Mapping[str, Any]) -> OutputFormat | None:
    """Responses spells structured output `text.format` (the schema at its top); else response_format; or an
    alias."""
    text = p.obj(body, "text") or {}
    fmt = p.nested(p.obj, text, "format", "text.format")
    return output_format(body, response_format(body) if fmt is None else format_object(fmt, "text.format"))


def _echo(body: Mapping[str, Any], max_tokens: int | None, instructions: str | None, store: bool,
          ) -> dict[str, Any]:
    metadata = body.get("metadata")
    text = p.obj(body, "text") or {}
    return {"instructions": instructions, "max_output_tokens": max_tokens,
            "text": {"format": text.get("format") or {"type": "text"}},
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto",
            "previous_response_id": body.get("previous_response_id"), "store": store,
            "metadata": metadata if isinstance(metadata, dict) else {}}


def parse_responses(raw: Any) -> ResponsesRequest:
    """A /v1/responses body -> ResponsesRequest; `ignored` names the fields it ignores."""
    body = body_object(raw)
    ignored = p.ignored_fields("responses", body)
    fmt = _text_format(body)
    instructions = p.string(body, "instructions") or None
    max_tokens = p.max_tokens(body, ("max_output_tokens", "max_tokens"))
    messages = _input(body)
    params = GenerationParams(
        **p.generation_basics(body), **thinking_controls(body),
        messages=messages, tools=p.array_of(body, "tools", _tool) or None, tool_choice=_tool_choice(body),
        parallel_tool_calls=p.boolean(body, "parallel_tool_calls") is not False,
        max_tokens=max_tokens,
        template_kwargs=p.obj(body, "chat_template_kwargs") or {}, output_format=fmt, ignored=ignored,
        messages_param="input",
    )
    store = p.boolean(body, "store") is not False
    echo = {**_echo(body, max_tokens, instructions, store),
            "reasoning": {"effort": params.reasoning_effort, "summary": None}}  # the effort asked for
    return ResponsesRequest(params, messages, instructions, p.string(body, "previous_response_id") or None, store,
                            echo)
