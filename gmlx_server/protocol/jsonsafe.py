"""Hostile JSON, refused before it can hurt: nesting past a limit (RecursionError in the parser, the
templates or the schema checkers) and lone UTF-16 surrogates (not Unicode: tokenizers and encoders
fail on them). Both are client bugs, so each is a 400 naming the field.

The depth scan reads the raw bytes with numpy (escapes blanked, quoted text masked), so it costs
about the same on a 32 MB body as counting its brackets and never recurses.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from gmlx_server.errors import InvalidRequest

MAX_DEPTH = 128  # arrays and objects nested in a request body, or in a JSON text a field carries
MAX_SCHEMA_DEPTH = 64  # arrays and objects nested in one JSON schema (structured output)

_CHUNK = 1 << 22  # bytes per numpy pass: bounds the scan's memory on a large body
_ESCAPE = re.compile(rb"\\.", re.DOTALL)  # blanked to two spaces: no quote stays escaped, offsets hold
_STEP = np.zeros(256, np.int8)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1
_QUOTE = ord('"')
_SURROGATE = re.compile("[\ud800-\udfff]")
_ANY_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # paired or not: the value decides

Levels = tuple[int, npt.NDArray[np.uint8], npt.NDArray[np.bool_], npt.NDArray[np.int32]]


def _levels(raw: bytes) -> Iterator[Levels]:
    """Per chunk: (start, bytes, inside-a-string mask, nesting level after each byte)."""
    blanked = _ESCAPE.sub(b"  ", raw)
    depth, inside = 0, 0
    for start in range(0, len(blanked), _CHUNK):
        b = np.frombuffer(blanked, np.uint8, count=min(_CHUNK, len(blanked) - start), offset=start)
        quoted = ((np.cumsum(b == _QUOTE, dtype=np.uint8) + inside) & 1).astype(np.bool_)
        steps = _STEP[b]
        steps[quoted] = 0
        levels = np.cumsum(steps, dtype=np.int32) + depth
        yield start, b, quoted, levels
        depth, inside = int(levels[-1]), int(quoted[-1])


def too_deep_at(raw: bytes, limit: int = MAX_DEPTH) -> int | None:
    """The offset of the first bracket that opens level limit + 1 (brackets in strings skipped), or None."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return None  # the common case, at the cost of two counts
    for start, _, _, levels in _levels(raw):
        over = np.flatnonzero(levels > limit)
        if over.size:
            return start + int(over[0])
    return None


def _top_level_key(raw: bytes, offset: int) -> str | None:
    """The member of the top-level object whose value holds `offset` (None for a top-level array)."""
    if not raw.lstrip().startswith(b"{"):
        return None
    key_at = None
    for start, b, quoted, levels in _levels(raw[:offset]):
        opening = np.flatnonzero((b == _QUOTE) & quoted & (levels == 1))
        if opening.size:
            key_at = start + int(opening[-1])
    if key_at is None:
        return None
    end = key_at + _ESCAPE.sub(b"  ", raw[key_at:offset]).index(b'"', 1)
    key = json.loads(raw[key_at:end + 1])
    return printable(key) if isinstance(key, str) else None


def printable(text: str) -> str:
    """`text` with any lone surrogate written as its \\uXXXX escape, so it can be rendered."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8") if _SURROGATE.search(text) else text


def check_depth(raw: bytes, where: str | None = None, limit: int = MAX_DEPTH) -> None:
    """400 when `raw` (JSON text) nests deeper than `limit`; `where` names the field holding the text."""
    at = too_deep_at(raw, limit)
    if at is None:
        return
    name = where or _top_level_key(raw, at)
    what = f"'{name}': nested" if name else "request body nests"
    raise InvalidRequest(f"{what} deeper than {limit} levels of arrays and objects (the limit)", param=name,
                         code="json_too_deep")


def depth_of(value: Any) -> int:
    """How many arrays and objects nest in a parsed JSON value (iterative: any depth is safe)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, level = stack.pop()
        items = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        if items is not None:
            deepest = max(deepest, level)
            stack.extend((item, level + 1) for item in items)
    return deepest


def surrogate_path(value: Any) -> str | None:
    """The path (`messages[0].content`, `model`) of the first string or key holding a lone surrogate."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str) and _SURROGATE.search(v):
            return path
        if isinstance(v, dict):
            for k, item in reversed(list(v.items())):
                sub = f"{path}.{k}" if path else str(k)
                if _SURROGATE.search(k):
                    return sub
                stack.append((sub, item))
        elif isinstance(v, list):
            stack.extend(reversed([(f"{path}[{i}]", item) for i, item in enumerate(v)]))
    return None


def _has_lone_surrogate(value: Any, raw: bytes) -> bool:
    """Cheap first: no surrogate escape in the text at all (a literal-led search, ~1 ms a MB); else the
    decoded value, where a valid pair is already one character, so any surrogate left is lone. Both run in
    C; a regex for lone escapes needs a lookbehind and cost 23 ms a MB, 0.7 s on a 30 MB body."""
    if not _ANY_SURROGATE_ESCAPE.search(raw):
        return False
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_unicode(value: Any, raw: bytes, where: str | None = None) -> None:
    """400 when a string decoded from `raw` holds a lone surrogate (a \\uD800 escape without its pair)."""
    if not _has_lone_surrogate(value, raw):
        return
    path = surrogate_path(value)
    if path is None:
        return
    name = printable(where or path) or None
    raise InvalidRequest(f"'{name or 'body'}': a lone UTF-16 surrogate escape (\\ud800-\\udfff without its "
                         "pair) is not valid Unicode", param=name, code="invalid_unicode")


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def loads(raw: bytes) -> Any:
    """A request body -> its JSON value: UTF-8, nesting, JSON syntax (NaN/Infinity refused) and
    lone surrogates checked, each failure a 400."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidRequest(f"request body is not valid UTF-8 (byte {e.start})") from None
    check_depth(raw)
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except ValueError as e:
        raise InvalidRequest(f"request body is not valid JSON: {e}") from None
    check_unicode(value, raw)
    return value
