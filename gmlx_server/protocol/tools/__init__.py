"""Tool-call parsing: infer the syntax from a chat template, then parse a response as it streams.

    fmt = infer_tool_format(template_text)       # None: the template defines no tool calls
    fmt = format_of(syntax)                      # the parser of a syntax (engine/tool_syntax.py)
    parser = fmt.streaming(tools)                # one per response
    events = parser.feed(delta) ... parser.finish()
"""

from gmlx_server.protocol.tools.call_stream import CallParser, ToolFormat, ToolStreamParser, new_call_id
from gmlx_server.protocol.tools.formats import FORMATS, format_of, infer_tool_format
from gmlx_server.protocol.tools.lenient import LenientCalls
from gmlx_server.protocol.tools.parse_events import (
    ParsedCall,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolEvent,
)

__all__ = [
    "FORMATS",
    "CallParser",
    "LenientCalls",
    "ParsedCall",
    "TextDelta",
    "ToolCallArgsDelta",
    "ToolCallEnd",
    "ToolCallStart",
    "ToolEvent",
    "ToolFormat",
    "ToolStreamParser",
    "format_of",
    "infer_tool_format",
    "new_call_id",
]
