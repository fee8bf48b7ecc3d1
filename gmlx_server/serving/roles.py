"""Message order a template rejects, repaired: harnesses send two system (developer) turns in a row, or two
user turns, and templates such as Gemma's raise "Conversation roles must alternate". Tried only after the
template refuses the messages as sent, mildest first, so a template that accepts them sees them unchanged.

Pure functions over OpenAI-shaped messages (content a string or a list of parts).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gmlx_server.engine.tool_syntax import GMLX_JSON

Message = dict[str, Any]
_MERGEABLE = frozenset({"system", "user", "assistant"})


def _parts(content: Any) -> list[Any]:
    if content is None:
        return []
    return list(content) if isinstance(content, list) else [{"type": "text", "text": str(content)}]


def join_contents(a: Any, b: Any) -> Any:
    """Two contents as one, a blank line between (strings stay strings; parts lists are concatenated)."""
    if isinstance(a, str | None) and isinstance(b, str | None):
        return "\n\n".join(x for x in (a, b) if x)
    return [*_parts(a), {"type": "text", "text": "\n\n"}, *_parts(b)]


def _mergeable(m: Message) -> bool:
    return m.get("role") in _MERGEABLE and not m.get("tool_calls")


def merge_roles(messages: Sequence[Message]) -> list[Message]:
    """`developer` becomes `system`; consecutive system, user or assistant turns (without tool calls) merge."""
    out: list[Message] = []
    for raw in messages:
        m = {**raw, "role": "system"} if raw.get("role") == "developer" else dict(raw)
        if out and _mergeable(m) and _mergeable(out[-1]) and out[-1]["role"] == m["role"]:
            out[-1] = {**out[-1], "content": join_contents(out[-1].get("content"), m.get("content"))}
        else:
            out.append(m)
    return out


def fold_system(messages: Sequence[Message]) -> list[Message]:
    """Merge roles, then fold every system turn into the user turn after it (Gemma's own convention for a
    template without a system role), or into a new user turn when none follows."""
    out: list[Message] = []
    pending: Any = None
    for m in merge_roles(messages):
        if m["role"] == "system":
            pending = join_contents(pending, m.get("content"))
        elif m["role"] == "user" and pending is not None:
            out.append({**m, "content": join_contents(pending, m.get("content"))})
            pending = None
        else:
            out.append(m)
    if pending is not None:
        out.append({"role": "user", "content": pending})
    return merge_roles(out)


def lead_with_user(messages: Sequence[Message]) -> list[Message]:
    """Fold system turns, then open with an empty user turn when the conversation starts with the assistant
    (templates that alternate from a user turn refuse a leading assistant turn)."""
    out = fold_system(messages)
    return out if out and out[0]["role"] == "user" else [{"role": "user", "content": ""}, *out]


def function_of(item: Mapping[str, Any]) -> Mapping[str, Any]:
    """{"type": "function", "function": {...}} -> its function (a bare function stays as it is)."""
    fn = item.get("function")
    return fn if isinstance(fn, Mapping) else item


def call_text(call: Mapping[str, Any]) -> str:
    """An earlier call, written the way gmlx's tool prompt asks the model to write calls."""
    fn = function_of(call)
    args = fn.get("arguments")
    if isinstance(args, str):  # not JSON (the protocol parsed what was): keep the client's text
        body = json.dumps({"name": fn.get("name")}, ensure_ascii=False)[:-1] + f', "arguments": {args}}}'
    else:
        body = json.dumps({"name": fn.get("name"), "arguments": args or {}}, ensure_ascii=False)
    return f"{GMLX_JSON.starts[0]}\n{body}\n{GMLX_JSON.end}"


def _text(content: Any) -> str:
    return "".join(str(p.get("text", "")) for p in _parts(content) if isinstance(p, Mapping))


def plain_tool_turns(messages: Sequence[Message]) -> list[Message]:
    """Calls become assistant text, results user text: the template needs no tool support."""
    out: list[Message] = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            calls = "\n".join(call_text(c) for c in m["tool_calls"])
            rest = {k: v for k, v in m.items() if k != "tool_calls"}
            out.append({**rest, "content": join_contents(m.get("content"), calls)})
        elif role == "tool":
            result = f"<tool_response>\n{_text(m.get('content'))}\n</tool_response>"
            if i > 0 and messages[i - 1].get("role") == "tool":  # results of one turn share a user message
                out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n{result}"}
            else:
                out.append({"role": "user", "content": result})
        else:
            out.append(dict(m))
    return out


def tool_turns_as_text(messages: Sequence[Message]) -> list[Message]:
    """Last resort for a template that cannot take this tool history (no tool role, a call without content,
    a result without a function name): the plain turns of gmlx's tool prompt, then the folds above."""
    return lead_with_user(plain_tool_turns(messages))


# Mildest first: what each repair did, for the log.
REPAIRS: tuple[tuple[str, Callable[[Sequence[Message]], list[Message]]], ...] = (
    ("merged consecutive same-role messages (developer as system)", merge_roles),
    ("merged same-role messages and folded system messages into user turns", fold_system),
    ("folded system messages and opened with an empty user turn", lead_with_user),
    ("wrote tool calls and results as plain turns, then folded roles", tool_turns_as_text),
)
