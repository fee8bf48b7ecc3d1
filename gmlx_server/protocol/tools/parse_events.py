"""What a streaming tool-call parser emits; the protocol layer renders these per wire format."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TextDelta:
    """Text that is safe to show: it cannot be (the start of) a tool call."""

    text: str


@dataclass(frozen=True)
class ToolCallStart:
    """A call opens. `id` is opaque: the protocol formats it (call_<id> for OpenAI, toolu_<id> for Anthropic)."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgsDelta:
    """A piece of the call's arguments as JSON text; the pieces of one call concatenate to a JSON object."""

    index: int
    json_fragment: str


@dataclass(frozen=True)
class ToolCallEnd:
    index: int
    arguments: dict[str, Any]


ToolEvent = TextDelta | ToolCallStart | ToolCallArgsDelta | ToolCallEnd


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: dict[str, Any]
