"""POST /v1/responses (OpenAI Responses), with previous_response_id served from a bounded store."""

from __future__ import annotations

import functools
import time

import falcon.asgi

from gmlx_server.assistants import Assistants, start_reply, with_trace
from gmlx_server.protocol.reasoning_split import with_reasoning
from gmlx_server.protocol.responses import parse_responses
from gmlx_server.protocol.responses_out import ResponsesEncoder, ResponsesMeta
from gmlx_server.protocol.shared import new_id
from gmlx_server.protocol.tool_calls import parallel_honoured, with_tool_calls
from gmlx_server.routes.common import GmlxRequest, report_clamp
from gmlx_server.routes.event_driver import send
from gmlx_server.routes.parsing import parse_body
from gmlx_server.routes.request_log import request_record
from gmlx_server.serving.conversations import ResponseStore
from gmlx_server.serving.model_host import ModelHost


class Responses:
    def __init__(self, host: ModelHost, store: ResponseStore, assistants: Assistants | None = None) -> None:
        self.host, self.store, self.assistants = host, store, assistants

    async def on_post(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        request = await parse_body(req, parse_responses)
        prev = request.previous_response_id
        history = self.store.get(prev) if prev is not None else ()
        params = request.with_history(history)
        response_id = new_id("resp_")
        started = await start_reply(self.host, self.assistants, params, response_id, request_record(req))
        echo = {**request.echo, "parallel_tool_calls": parallel_honoured(params, started.tools)}
        meta = ResponsesMeta(response_id, started.model_id, int(time.time()), started.prompt_tokens, echo)
        encoder = ResponsesEncoder(meta)
        report_clamp(resp, started.requested_max_tokens, started.max_tokens)

        def remember() -> None:  # only a finished, stored response can be continued
            if request.store:
                self.store.put(response_id, [*history, *request.input_messages, *encoder.output_messages()])

        reading = with_reasoning(with_tool_calls(encoder, params, started.tools), encoder, started.reasoning)
        traced = with_trace(reading, started, "responses")
        await send(req, resp, started.handle, traced, params.stream, self.host.env.sse_keepalive_s, remember,
                   functools.partial(self.host.prefill_progress, started.model_id, response_id))
