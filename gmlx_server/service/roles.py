"""Message order a template rejects, repaired: harnesses send two system (developer) turns in a row, or two
user turns, and templates such as Gemma's raise "Conversation roles must alternate". Tried only after the
template refuses the messages as sent, mildest first, so a template that accepts them sees them unchanged.

Pure functions over OpenAI-shaped messages (content a string or a list of parts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

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


# Mildest first: what each repair did, for the log.
REPAIRS: tuple[tuple[str, Callable[[Sequence[Message]], list[Message]]], ...] = (
    ("merged consecutive same-role messages (developer as system)", merge_roles),
    ("merged same-role messages and folded system messages into user turns", fold_system),
    ("folded system messages and opened with an empty user turn", lead_with_user),
)
