"""OpenAI request bodies -> neutral generation inputs (pure; raises InvalidRequest with `param`).

Unknown fields are accepted. The result, `GenerationParams`, is what service.generate consumes
(structurally: protocol and service do not import each other).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gmlx_server.errors import InvalidRequest, UnsupportedFeature
from gmlx_server.protocol import params as p

_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


@dataclass(frozen=True)
class GenerationParams:
    """One generation request in neutral form; `prompt` set means raw text, no chat template."""

    model: str = ""
    profile: str | None = None
    messages: tuple[dict[str, Any], ...] = ()
    prompt: str | None = None
    tools: tuple[dict[str, Any], ...] | None = None
    tool_choice: str | dict[str, Any] | None = None
    sampling: Mapping[str, Any] = field(default_factory=dict)  # explicit fields only
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    enable_thinking: bool | None = None
    thinking_budget: int | None = None
    reasoning_effort: str | None = None
    stream: bool = False
    include_usage: bool = False
    timings_per_token: bool = False
    ignored: tuple[str, ...] = ()


def _bad(param: str, what: str) -> InvalidRequest:
    return InvalidRequest(f"'{param}': {what}", param=param)


def _content(msg: Mapping[str, Any], where: str) -> str | None:
    """Text content: a string, or text parts joined; media parts need a vision model (not built yet)."""
    c = msg.get("content")
    if c is None or isinstance(c, str):
        return c
    if not isinstance(c, list):
        raise _bad(f"{where}.content", f"expected a string or an array of parts, got {p.json_type(c)}")
    texts = []
    for j, part in enumerate(c):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in ("image_url", "input_image", "input_audio", "image"):
            raise UnsupportedFeature(f"'{where}.content[{j}]': {kind} parts need a vision model (mmproj), "
                                     "which this server does not support yet", param=f"{where}.content")
        else:
            raise _bad(f"{where}.content[{j}]", "expected a {\"type\": \"text\", \"text\": ...} part")
    return "\n".join(texts)


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """Templates expect arguments as objects (transformers' convention); OpenAI sends JSON strings."""
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        raise _bad(f"{where}.tool_calls", "expected an array of objects")
    out = []
    for c in calls:
        fn = dict(c.get("function") or {})
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                parsed = json.loads(args) if args.strip() else {}
                fn["arguments"] = parsed if isinstance(parsed, dict) else args
            except ValueError:
                pass  # keep the string; the template decides
        out.append({**c, "function": fn})
    return out


def _message(i: int, msg: Any) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise _bad(where, f"expected an object, got {p.json_type(msg)}")
    role = msg.get("role")
    if role not in _ROLES:
        raise _bad(f"{where}.role", f"expected one of {', '.join(_ROLES)}, got {role!r}")
    out = dict(msg)
    out["role"] = {"developer": "system", "function": "tool"}.get(role, role)  # templates know neither
    out["content"] = _content(msg, where)
    if out["content"] is None and role != "assistant":
        raise _bad(f"{where}.content", f"a {role} message needs content")
    if msg.get("tool_calls") is not None:
        out["tool_calls"] = _tool_calls(msg["tool_calls"], where)
    return out


def _messages(body: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        raise _bad("messages", "required: an array of messages" if msgs is None else "expected an array")
    if not msgs:
        raise _bad("messages", "must contain at least one message")
    return tuple(_message(i, m) for i, m in enumerate(msgs))


def _is_function(t: Any) -> bool:
    fn = t.get("function") if isinstance(t, dict) else None
    return isinstance(fn, dict) and isinstance(fn.get("name"), str)


def _tools(body: Mapping[str, Any]) -> tuple[tuple[dict[str, Any], ...] | None, str | dict[str, Any] | None]:
    tools = body.get("tools")
    if tools is not None:
        ok = isinstance(tools, list) and all(_is_function(t) for t in tools)
        if not ok:
            raise _bad("tools", 'expected an array of {"type": "function", "function": {"name": ...}}')
    choice = body.get("tool_choice")
    if choice is not None and choice not in ("none", "auto", "required") and not _is_function(choice):
        raise _bad("tool_choice", 'expected none, auto, required or {"type": "function", "function": {...}}')
    return (tuple(tools) if tools else None), choice


def _response_format(body: Mapping[str, Any]) -> None:
    rf = p.obj(body, "response_format")
    if rf is None or rf.get("type") == "text":
        return
    if rf.get("type") in ("json_object", "json_schema"):
        raise UnsupportedFeature("'response_format': structured output is not supported by this build yet",
                                 param="response_format")
    kind = rf.get("type")
    raise _bad("response_format", f"unknown type {kind!r} (expected text, json_object or json_schema)")


def _reasoning(body: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI's `reasoning` object ({effort}; OpenRouter adds max_tokens and enabled)."""
    reasoning = p.obj(body, "reasoning") or {}
    try:
        return {"effort": p.string(reasoning, "effort", _EFFORTS),
                "max_tokens": p.integer(reasoning, "max_tokens", 0),
                "enabled": p.boolean(reasoning, "enabled")}
    except InvalidRequest as e:
        raise InvalidRequest(e.message.replace("'", "'reasoning.", 1), param=f"reasoning.{e.param}") from None


def _thinking(body: Mapping[str, Any]) -> dict[str, Any]:
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
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model", f"expected a string, got {p.json_type(model)}")
    stream_options = p.obj(body, "stream_options") or {}
    return {
        "model": model or "",
        "profile": p.string(body, "profile") or None,
        "sampling": p.sampling(body),
        "logit_bias": p.logit_bias(body),
        "stop": p.stop(body),
        "stream": bool(p.boolean(body, "stream")),
        "include_usage": bool(p.boolean(stream_options, "include_usage")),
    }


def _object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object", param=None)
    return body


def parse_chat(raw: Any, path: str = "/v1/chat/completions") -> GenerationParams:
    """A /v1/chat/completions body -> GenerationParams; warns once about ignored parameters."""
    body = _object(raw)
    ignored = p.warn_ignored("chat", path, body)
    _response_format(body)
    tools, choice = _tools(body)
    top_logprobs = p.integer(body, "top_logprobs", 0, 20) or 0
    logprobs = bool(p.boolean(body, "logprobs"))
    if top_logprobs and not logprobs:
        raise _bad("top_logprobs", "requires 'logprobs': true")
    return GenerationParams(
        **_common(body), **_thinking(body),
        messages=_messages(body), tools=tools, tool_choice=choice,
        max_tokens=p.max_tokens(body, ("max_completion_tokens", "max_tokens", "max_output_tokens")),
        logprobs=logprobs, top_logprobs=top_logprobs,
        template_kwargs=p.obj(body, "chat_template_kwargs") or {},
        timings_per_token=bool(p.boolean(body, "timings_per_token")),
        ignored=ignored,
    )


def _reject_completion_features(body: Mapping[str, Any]) -> None:
    if (p.integer(body, "n", 1) or 1) > 1:
        raise _bad("n", "only n = 1 is supported: the server returns a single choice")
    if (p.integer(body, "best_of", 1) or 1) > 1:
        raise _bad("best_of", "best_of > 1 is not supported")
    if p.boolean(body, "echo"):
        raise _bad("echo", "echo is not supported")
    if body.get("suffix") not in (None, ""):
        raise _bad("suffix", "suffix is not supported")


def parse_completion(raw: Any, path: str = "/v1/completions") -> GenerationParams:
    """A /v1/completions body: one string prompt, one choice, no chat template."""
    body = _object(raw)
    ignored = p.warn_ignored("completions", path, body)
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        raise _bad("prompt", "list and token-array prompts are not supported; send a single string")
    if not isinstance(prompt, str):
        what = "required: a string" if prompt is None else f"expected a string, got {p.json_type(prompt)}"
        raise _bad("prompt", what)
    _reject_completion_features(body)
    return GenerationParams(
        **_common(body), prompt=prompt,
        max_tokens=p.max_tokens(body, ("max_tokens", "max_output_tokens")),
        ignored=ignored,
    )
