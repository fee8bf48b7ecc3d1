"""Log output: gmlx's text lines, or one JSON object per line for log shippers (`--log-format json`,
GMLX_LOG_FORMAT=json). A record's structured fields (the request line's) ride in `extra={FIELDS: {...}}`
and become top-level keys of its JSON object.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

FIELDS = "gmlx_fields"  # the LogRecord attribute that carries a line's structured fields
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_FORMATS = ("text", "json")


def text_value(value: Any) -> str:
    """A value as one greppable token: `-` for none, JSON-quoted when it holds spaces, quotes or '='."""
    if value is None:
        return "-"
    text = str(value)
    return json.dumps(text, ensure_ascii=False) if not text or any(c in text for c in ' "=\n\t') else text


def kv_text(fields: dict[str, Any]) -> str:
    """`k=v k=v`: a structured line's text form."""
    return " ".join(f"{k}={text_value(v)}" for k, v in fields.items())


class JsonFormatter(logging.Formatter):
    """{"time", "level", "logger", "message", ...fields}: one object per line, exceptions in "exc_info"."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
        }
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, dict):
            out.update({k: v for k, v in fields.items() if k not in out})
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(level: int, fmt: str) -> None:
    """The root handler on stderr, in `fmt` (text or json), unless the root logger has one already."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
