"""POST /v1/messages and /v1/messages/count_tokens (Anthropic). The x-api-key, anthropic-version
and anthropic-beta headers are accepted; the key is checked by the API-key middleware."""

from __future__ import annotations

import functools

import falcon.asgi

from gmlx_server.assistants import Assistants, start_reply, with_trace
from gmlx_server.protocol.anthropic import parse_messages
from gmlx_server.protocol.anthropic_out import AnthropicEncoder, MessageMeta
from gmlx_server.protocol.reasoning_split import with_reasoning
from gmlx_server.protocol.shared import new_id
from gmlx_server.protocol.tool_calls import with_tool_calls
from gmlx_server.routes.common import GmlxRequest, report_clamp
from gmlx_server.routes.event_driver import send
from gmlx_server.routes.parsing import parse_body
from gmlx_server.routes.request_log import request_record
from gmlx_server.serving.generation import count_prompt_tokens
from gmlx_server.serving.model_host import ModelHost


class Messages:
    def __init__(self, host: ModelHost, assistants: Assistants | None = None) -> None:
        self.host, self.assistants = host, assistants

    async def on_post(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        params = await parse_body(req, parse_messages)
        message_id = new_id("msg_")
        started = await start_reply(self.host, self.assistants, params, message_id, request_record(req))
        base = AnthropicEncoder(MessageMeta(message_id, started.model_id, started.prompt_tokens,
                                            thinking=started.reasoning is not None))
        encoder = with_reasoning(with_tool_calls(base, params, started.tools), base, started.reasoning)
        encoder = with_trace(encoder, started, "anthropic")
        report_clamp(resp, started.requested_max_tokens, started.max_tokens)
        await send(req, resp, started.handle, encoder, params.stream, self.host.env.sse_keepalive_s,
                   progress=functools.partial(self.host.prefill_progress, started.model_id, message_id))


class CountTokens:
    """The prompt as /v1/messages would render and tokenize it, so the count equals its input_tokens."""

    def __init__(self, host: ModelHost) -> None:
        self.host = host

    async def on_post(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        params = await parse_body(req, parse_messages)
        _, tokens = await count_prompt_tokens(self.host, params)
        resp.media = {"input_tokens": tokens}
