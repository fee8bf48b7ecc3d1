"""OpenAI request bodies -> GenerationParams, the generation request (pure; raises InvalidRequest with `param`).

Unknown fields are accepted. `GenerationParams` (gmlx_server/generation_params.py) is what service.generate consumes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gmlx_server.errors import InvalidRequest, UnsupportedFeature
from gmlx_server.generation_params import GenerationParams, OutputFormat
from gmlx_server.protocol import jsonsafe
from gmlx_server.protocol import params as p
from gmlx_server.protocol.image_parts import openai_image, parts_content
from gmlx_server.protocol.output_fields import format_object, output_format

_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def content_parts(msg: Mapping[str, Any], where: str, images: bool = False) -> str | list[dict[str, Any]] | None:
    """A message's content: a string, or text parts joined; with `images` (user messages), image_url parts
    too, which make it an ordered list of text and image parts."""
    c = msg.get("content")
    if c is None or isinstance(c, str):
        return c
    if not isinstance(c, list):
        raise p.bad(f"{where}.content", f"expected a string or an array of parts, got {p.json_type(c)}")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(c):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image_url" and images:
            parts.append(openai_image(part, at))
        elif kind in ("image_url", "input_image", "input_audio", "image"):
            raise UnsupportedFeature(f"'{at}': {kind} parts are accepted in user messages only"
                                     if kind == "image_url" else f"'{at}': {kind} parts are not supported here",
                                     param=f"{where}.content")
        else:
            raise p.bad(at, "expected a {\"type\": \"text\", \"text\": ...} part")
    return parts_content(parts)


def text_content(msg: Mapping[str, Any], where: str) -> str | None:
    """Text content: a string, or text parts joined (no images where this is read)."""
    out = content_parts(msg, where)
    assert out is None or isinstance(out, str)
    return out


def template_tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """Templates expect arguments as objects (transformers' convention); OpenAI sends JSON strings."""
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        raise p.bad(f"{where}.tool_calls", "expected an array of objects")
    out = []
    for j, c in enumerate(calls):
        at = f"{where}.tool_calls[{j}].function"
        given: dict[str, Any] | None = p.nested(p.obj, c, "function", at)
        fn = dict(given or {})
        p.nested(p.string, fn, "name", f"{at}.name")
        args = fn.get("arguments")
        if isinstance(args, str):
            fn["arguments"] = arguments_value(args, f"{at}.arguments")
        elif args is not None and not isinstance(args, dict):
            raise p.bad(f"{at}.arguments", f"expected a JSON string or an object, got {p.json_type(args)}")
        out.append({**c, "function": fn})
    return out


def arguments_value(args: str, where: str) -> dict[str, Any] | str:
    """JSON-string arguments as an object; text that is not a JSON object stays a string (the template
    decides), but nesting past the limit or a lone surrogate in it is the client's 400."""
    if not args.strip():
        return {}
    raw = args.encode("utf-8", "surrogatepass")
    jsonsafe.check_depth(raw, where)
    try:
        parsed = json.loads(args)
    except ValueError:
        return args
    jsonsafe.check_unicode(parsed, raw, where)
    return parsed if isinstance(parsed, dict) else args


def _message(i: int, msg: Any) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise p.bad(where, f"expected an object, got {p.json_type(msg)}")
    role = msg.get("role")
    if role not in _ROLES:
        raise p.bad(f"{where}.role", f"expected one of {', '.join(_ROLES)}, got {role!r}")
    out = dict(msg)
    out["role"] = {"developer": "system", "function": "tool"}.get(role, role)  # templates know neither
    out["content"] = content_parts(msg, where, images=role == "user")
    if out["content"] is None and role != "assistant":
        raise p.bad(f"{where}.content", f"a {role} message needs content")
    if msg.get("tool_calls") is not None:
        out["tool_calls"] = template_tool_calls(msg["tool_calls"], where)
    for name in ("reasoning_content", "reasoning"):  # an earlier turn's thinking, for templates that render it
        if msg.get(name) is not None and not isinstance(msg[name], str):
            raise p.bad(f"{where}.{name}", f"expected a string, got {p.json_type(msg[name])}")
    return out


def _messages(body: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        raise p.bad("messages", "required: an array of messages" if msgs is None else "expected an array")
    if not msgs:
        raise p.bad("messages", "must contain at least one message")
    return tuple(_message(i, m) for i, m in enumerate(msgs))


def _is_function(t: Any) -> bool:
    fn = t.get("function") if isinstance(t, dict) else None
    return isinstance(fn, dict) and isinstance(fn.get("name"), str)


def _tools(body: Mapping[str, Any]) -> tuple[tuple[dict[str, Any], ...] | None, str | dict[str, Any] | None]:
    tools = body.get("tools")
    if tools is not None:
        ok = isinstance(tools, list) and all(_is_function(t) for t in tools)
        if not ok:
            raise p.bad("tools", 'expected an array of {"type": "function", "function": {"name": ...}}')
    choice = body.get("tool_choice")
    if choice is not None and choice not in ("none", "auto", "required") and not _is_function(choice):
        raise p.bad("tool_choice", 'expected none, auto, required or {"type": "function", "function": {...}}')
    return (tuple(tools) if tools else None), choice


def response_format(body: Mapping[str, Any]) -> OutputFormat | None:
    """`response_format` (json_schema, json_object, regex, choice, grammar); text (or none) leaves output free."""
    return format_object(p.obj(body, "response_format"), "response_format")


def _reasoning(body: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI's `reasoning` object ({effort}; OpenRouter adds max_tokens and enabled)."""
    reasoning = p.obj(body, "reasoning") or {}
    try:
        return {"effort": p.string(reasoning, "effort", _EFFORTS),
                "max_tokens": p.integer(reasoning, "max_tokens", 0),
                "enabled": p.boolean(reasoning, "enabled")}
    except InvalidRequest as e:
        raise InvalidRequest(e.message.replace("'", "'reasoning.", 1), param=f"reasoning.{e.param}") from None


def thinking_controls(body: Mapping[str, Any]) -> dict[str, Any]:
    reasoning = _reasoning(body)
    effort = p.string(body, "reasoning_effort", _EFFORTS) or reasoning["effort"]
    budget = p.integer(body, "thinking_budget", -1)
    if budget is None:
        budget = reasoning["max_tokens"]
    enable = p.boolean(body, "enable_thinking")
    if enable is None:
        enable = reasoning["enabled"]
    return {"enable_thinking": enable, "thinking_budget": None if budget == -1 else budget,
            "reasoning_effort": effort}


def _common(body: Mapping[str, Any]) -> dict[str, Any]:
    stream_options = p.obj(body, "stream_options") or {}
    return {**p.generation_basics(body), "stop": p.stop(body),
            "include_usage": bool(p.boolean(stream_options, "include_usage"))}


def body_object(body: Any) -> Mapping[str, Any]:
    """The request body, which must be a JSON object."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object", param=None)
    return body


def chat_prompt(body: Mapping[str, Any]) -> dict[str, Any]:
    """The fields a chat body's prompt is rendered from: messages, tools, template kwargs, thinking controls."""
    tools, choice = _tools(body)
    return {**thinking_controls(body), "messages": _messages(body), "tools": tools, "tool_choice": choice,
            "template_kwargs": p.obj(body, "chat_template_kwargs") or {}}


def parse_chat(raw: Any) -> GenerationParams:
    """A /v1/chat/completions body -> GenerationParams; `ignored` names the fields it ignores."""
    body = body_object(raw)
    ignored = p.ignored_fields("chat", body)
    fmt = output_format(body, response_format(body))
    prompt = chat_prompt(body)
    top_logprobs = p.integer(body, "top_logprobs", 0, 20) or 0
    logprobs = bool(p.boolean(body, "logprobs"))
    if top_logprobs and not logprobs:
        raise p.bad("top_logprobs", "requires 'logprobs': true")
    return GenerationParams(
        **_common(body), **prompt,
        parallel_tool_calls=p.boolean(body, "parallel_tool_calls") is not False,
        max_tokens=p.max_tokens(body, ("max_completion_tokens", "max_tokens", "max_output_tokens")),
        logprobs=logprobs, top_logprobs=top_logprobs,
        timings_per_token=bool(p.boolean(body, "timings_per_token")),
        output_format=fmt, ignored=ignored,
    )


def _reject_completion_features(body: Mapping[str, Any]) -> None:
    if (p.integer(body, "n", 1) or 1) > 1:
        raise p.bad("n", "only n = 1 is supported: the server returns a single choice")
    if (p.integer(body, "best_of", 1) or 1) > 1:
        raise p.bad("best_of", "best_of > 1 is not supported")
    if p.boolean(body, "echo"):
        raise p.bad("echo", "echo is not supported")
    if body.get("suffix") not in (None, ""):
        raise p.bad("suffix", "suffix is not supported")


def parse_completion(raw: Any) -> GenerationParams:
    """A /v1/completions body: one string prompt, one choice, no chat template."""
    body = body_object(raw)
    ignored = p.ignored_fields("completions", body)
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        raise p.bad("prompt", "list and token-array prompts are not supported; send a single string")
    if not isinstance(prompt, str):
        what = "required: a string" if prompt is None else f"expected a string, got {p.json_type(prompt)}"
        raise p.bad("prompt", what)
    _reject_completion_features(body)
    return GenerationParams(
        **_common(body), prompt=prompt,
        max_tokens=p.max_tokens(body, ("max_tokens", "max_output_tokens")),
        output_format=output_format(body, response_format(body)), ignored=ignored,
    )
