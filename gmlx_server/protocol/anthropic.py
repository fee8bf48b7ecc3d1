"""Anthropic Messages request bodies -> GenerationParams, the generation request (pure).

Content blocks become the chat template's messages the way transformers' templates expect them:
tool_use blocks -> the assistant's `tool_calls`, tool_result blocks -> `tool` role messages.
Unknown top-level fields (metadata, context_management, service_tier, ...) are accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gmlx_server.errors import UnsupportedFeature
from gmlx_server.generation_params import GenerationParams, OutputFormat
from gmlx_server.protocol import params as p
from gmlx_server.protocol.image_parts import anthropic_image, parts_content
from gmlx_server.protocol.openai import body_object, response_format, text_content, thinking_controls
from gmlx_server.protocol.output_fields import format_object, output_format
from gmlx_server.protocol.shared import merge_turns, name_tool_results, tool_call_entry, tool_function

_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "xhigh", "max": "xhigh"}
STOP_SEQUENCES_LIMIT = 64  # Anthropic publishes no limit; this bounds the engine's per-token stop check


def _block_type(block: Any, where: str) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if not isinstance(kind, str):
        raise p.bad(where, 'expected a content block ({"type": ...})')
    if kind == "document":
        raise UnsupportedFeature(f"'{where}': document blocks are not supported", param=where)
    return kind


def _blocks(content: Any, where: str) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise p.bad(where, f"expected a string or an array of content blocks, got {p.json_type(content)}")
    return content


def _tool_result(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    call_id = p.required_string(block, "tool_use_id", where)
    text = text_content({"content": block.get("content")}, where) or ""
    if p.nested(p.boolean, block, "is_error", f"{where}.is_error"):
        text = f"Error: {text}"  # templates have no error flag; say it in the text
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _user_turn(content: Any, where: str) -> list[dict[str, Any]]:
    """Text and image blocks form user messages; each tool_result becomes a `tool` message, order kept."""
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(_blocks(content, where)):
        at = f"{where}[{j}]"
        kind = _block_type(block, at)
        if kind == "text":
            parts.append({"type": "text", "text": p.required_string(block, "text", at)})
        elif kind == "image":
            parts.append(anthropic_image(block, at))
        elif kind == "tool_result":
            if parts:
                out.append({"role": "user", "content": parts_content(parts)})
                parts = []
            out.append(_tool_result(block, at))
        else:
            raise p.bad(at, f"a user message cannot hold a {kind!r} block (expected text, image or tool_result)")
    if parts or not out:
        out.append({"role": "user", "content": parts_content(parts)})
    return out


def _assistant_turn(content: Any, where: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thoughts: list[str] = []
    for j, block in enumerate(_blocks(content, where)):
        at = f"{where}[{j}]"
        kind = _block_type(block, at)
        if kind == "text":
            texts.append(p.required_string(block, "text", at))
        elif kind == "tool_use":
            call_id, name = p.required_string(block, "id", at), p.required_string(block, "name", at)
            calls.append(tool_call_entry(call_id, name, p.nested(p.obj, block, "input", f"{at}.input") or {}, at))
        elif kind == "thinking":
            thoughts.append(p.required_string(block, "thinking", at))
        elif kind != "redacted_thinking":  # encrypted: nothing a local model can read
            raise p.bad(at, f"an assistant message cannot hold a {kind!r} block "
                            "(expected text, tool_use or thinking)")
    # "" rather than None: simple templates concatenate content without checking it exists.
    msg: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    if thoughts:
        msg["reasoning_content"] = "\n".join(thoughts)  # what reasoning templates read from history
    return msg


_BILLING_HEADER = "x-anthropic-billing-header:"


def _system(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    system = body.get("system")
    if isinstance(system, list):
        # Claude Code's first block is a billing header for Anthropic's API, not an instruction: it changes
        # with every client version (a prompt-cache miss) and small models recite it.
        system = [b for b in system if not (isinstance(b, dict) and str(b.get("text", "")).startswith(
            _BILLING_HEADER))]
    text = text_content({"content": system}, "system") if system is not None else None
    return [{"role": "system", "content": text}] if text else []


def _conversation(body: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        raise p.bad("messages", "required: an array of messages" if msgs is None else "expected an array")
    if not msgs:
        raise p.bad("messages", "must contain at least one message")
    out = _system(body)
    # A mid-conversation system message (Claude Code's mid-conversation-system beta) joins the user
    # turn beside it: most chat templates accept a system message only first, and reject two users in a row.
    for i, msg in enumerate(msgs):
        where = f"messages[{i}]"
        role = msg.get("role") if isinstance(msg, dict) else None
        if role not in ("user", "assistant", "system"):
            raise p.bad(f"{where}.role", f"expected user, assistant or system, got {role!r}")
        if "content" not in msg:
            raise p.bad(f"{where}.content", "required")
        content, at = msg["content"], f"{where}.content"
        out.extend([_assistant_turn(content, at)] if role == "assistant" else _user_turn(content, at))
    return tuple(name_tool_results(merge_turns(out)))


def _tool(i: int, tool: Any) -> dict[str, Any] | None:
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise p.bad(where, f"expected an object, got {p.json_type(tool)}")
    name = p.required_string(tool, "name", where)
    if "input_schema" not in tool:
        return None  # server tools (web_search_*, ...) carry no schema: named in `ignored` (params.ignored_fields)
    schema = p.nested(p.obj, tool, "input_schema", f"{where}.input_schema")
    return tool_function(name, tool.get("description"), schema)


def _tool_choice(body: Mapping[str, Any]) -> str | dict[str, Any] | None:
    choice = p.obj(body, "tool_choice")
    if choice is None:
        return None
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": p.required_string(choice, "name", "tool_choice")}}
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind) if isinstance(kind, str) else None
    if mapped is None:
        raise p.bad("tool_choice.type", f"expected auto, any, tool or none, got {kind!r}")
    return mapped


def _parallel(body: Mapping[str, Any]) -> bool:
    """tool_choice.disable_parallel_tool_use: true asks for one call at most."""
    choice = p.obj(body, "tool_choice") or {}
    return p.nested(p.boolean, choice, "disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use") is not True


def _tools(body: Mapping[str, Any]) -> tuple[tuple[dict[str, Any], ...] | None, str | dict[str, Any] | None]:
    return p.array_of(body, "tools", _tool) or None, _tool_choice(body)


def _thinking_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """Anthropic's `thinking` maps onto GenerationParams' thinking controls; explicit gmlx fields win."""
    out = thinking_controls(body)
    thinking = p.obj(body, "thinking") or {}
    kind = thinking.get("type")
    if kind == "enabled":
        budget = p.nested(p.integer, thinking, "budget_tokens", "thinking.budget_tokens", 0)
        out["enable_thinking"] = True if out["enable_thinking"] is None else out["enable_thinking"]
        out["thinking_budget"] = budget if out["thinking_budget"] is None else out["thinking_budget"]
    elif kind == "disabled" and out["enable_thinking"] is None:
        out["enable_thinking"] = False
    # `adaptive` leaves the choice to the model (the template's default); output_config.effort is its dial.
    effort = p.nested(p.string, p.obj(body, "output_config") or {}, "effort", "output_config.effort")
    if out["reasoning_effort"] is None and effort is not None:
        out["reasoning_effort"] = _EFFORTS.get(effort)  # a newer level than we know: the template's default
    return out


def _output_config(body: Mapping[str, Any]) -> OutputFormat | None:
    """Anthropic's structured output (output_config.format), else OpenAI's response_format; or an alias."""
    config = p.obj(body, "output_config") or {}
    fmt = p.nested(p.obj, config, "format", "output_config.format")
    native = response_format(body) if fmt is None else format_object(fmt, "output_config.format")
    return output_format(body, native)


def parse_messages(raw: Any) -> GenerationParams:
    """A /v1/messages (or count_tokens) body -> GenerationParams; `ignored` names the fields it ignores."""
    body = body_object(raw)
    ignored = p.ignored_fields("messages", body)
    fmt = _output_config(body)
    tools, choice = _tools(body)
    return GenerationParams(
        **p.generation_basics(body), **_thinking_fields(body),
        messages=_conversation(body), tools=tools, tool_choice=choice, parallel_tool_calls=_parallel(body),
        max_tokens=p.max_tokens(body, ("max_tokens", "max_output_tokens")),
        stop=p.stop(body, "stop_sequences", STOP_SEQUENCES_LIMIT),
        template_kwargs=p.obj(body, "chat_template_kwargs") or {},
        output_format=fmt, ignored=ignored,
    )
