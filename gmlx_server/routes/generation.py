"""POST /v1/chat/completions and POST /v1/completions: parse -> start -> stream or collect."""

from __future__ import annotations

import functools
import time
import uuid

import falcon.asgi

from gmlx_server.assistants import Assistants, start_reply, with_trace
from gmlx_server.generation_params import GenerationParams
from gmlx_server.protocol.openai import parse_chat, parse_completion
from gmlx_server.protocol.openai_out import OpenAIEncoder, ResponseMeta
from gmlx_server.protocol.reasoning_split import with_reasoning
from gmlx_server.protocol.tool_calls import with_tool_calls
from gmlx_server.routes.common import GmlxRequest, body_of, report_clamp
from gmlx_server.routes.event_driver import send
from gmlx_server.routes.parsing import parse_body
from gmlx_server.routes.request_log import request_record
from gmlx_server.serving.estimate import Estimator
from gmlx_server.serving.model_host import ModelHost


async def respond(req: GmlxRequest, resp: falcon.asgi.Response, host: ModelHost, params: GenerationParams,
                  kind: str, assistants: Assistants | None = None) -> None:
    chat = kind == "chat"
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    started = await start_reply(host, assistants, params, rid, request_record(req))  # assistants: chat only
    meta = ResponseMeta(rid, started.model_id, int(time.time()), started.prompt_tokens,
                        "chat" if chat else "completion", params.include_usage, params.timings_per_token,
                        params.logprobs)
    base = OpenAIEncoder(meta, started.tokenizer)
    encoder = with_reasoning(with_tool_calls(base, params, started.tools), base, started.reasoning)
    encoder = with_trace(encoder, started, "chat", {"id": rid, "created": meta.created, "model": meta.model})
    report_clamp(resp, started.requested_max_tokens, started.max_tokens)
    await send(req, resp, started.handle, encoder, params.stream, host.env.sse_keepalive_s,
               progress=functools.partial(host.prefill_progress, started.model_id, rid))


class ChatCompletions:
    def __init__(self, host: ModelHost, estimator: Estimator, assistants: Assistants | None = None) -> None:
        self.host, self.estimator, self.assistants = host, estimator, assistants

    async def on_post(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        body = body_of(req)
        params = await parse_body(req, parse_chat)
        if isinstance(body, dict) and body.get("dry_run") is True:
            resp.media = await self.estimator.estimate(params)  # the same estimate as POST /v1/estimate
            return
        await respond(req, resp, self.host, params, "chat", self.assistants)


class Completions:
    def __init__(self, host: ModelHost) -> None:
        self.host = host

    async def on_post(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        await respond(req, resp, self.host, await parse_body(req, parse_completion), "completion")
