"""Which tool-call syntax a loaded model speaks: inferred from its chat template once, then remembered."""

from __future__ import annotations

import logging
import weakref

from gmlx_server.engine.types import ChatTemplate
from gmlx_server.protocol.tools.formats import infer_tool_format
from gmlx_server.protocol.tools.stream import ToolFormat

log = logging.getLogger("gmlx.tools")

# Keyed by the template object, which lives exactly as long as its engine: one inference per load.
_INFERRED: weakref.WeakKeyDictionary[ChatTemplate, ToolFormat | None] = weakref.WeakKeyDictionary()


def tool_format_for(template: ChatTemplate) -> ToolFormat | None:
    """The template's tool-call syntax, or None: tools are accepted and the model answers in text."""
    if template in _INFERRED:
        return _INFERRED[template]
    fmt = _INFERRED[template] = infer_tool_format(template.text)
    if fmt is None:
        log.info("chat template (%s) defines no tool-call syntax: tool requests are answered in text",
                 template.source)
    else:
        log.info("chat template (%s): tool calls parsed as %s", template.source, fmt.name)
    return fmt
