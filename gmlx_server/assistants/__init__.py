"""Assistant ids: the server runs a model's tool calls itself, through config-allowlisted MCP tools.

registry.py holds the configured assistants and their MCP links (link.py, on the official MCP SDK);
loop.py runs the tool loop as a request handle the routes stream; toolbox.py runs one call; trace.py shows
the calls to clients; metrics.py counts them. The routes call start_reply instead of start_generation.
"""

from gmlx_server.assistants.loop import AssistantStarted, start_reply
from gmlx_server.assistants.registry import Assistants, AssistantUnavailable
from gmlx_server.assistants.trace import with_trace

__all__ = ["AssistantStarted", "AssistantUnavailable", "Assistants", "start_reply", "with_trace"]
