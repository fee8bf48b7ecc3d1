"""POST /tokenize, /detokenize and /apply-template (and their /v1 spellings): llama-server's and vLLM's
tokenizer routes, behind the API key like every other route."""

from __future__ import annotations

import falcon.asgi

from gmlx_server.protocol.tokenization_wire import (
    detokenize_answer,
    parse_apply_template,
    parse_detokenize,
    parse_tokenize,
    template_answer,
    tokenize_answer,
)
from gmlx_server.routes.common import GmlxRequest
from gmlx_server.routes.parsing import parse_body
from gmlx_server.serving.tokenization import Tokenization


class Tokenize:
    def __init__(self, tokenization: Tokenization) -> None:
        self.tokenization = tokenization

    async def on_post(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        parsed = await parse_body(req, parse_tokenize)
        inp, t = parsed.params, self.tokenization
        tokens = (await t.text(inp, parsed.add_special, parsed.wants_pieces, parsed.text_param)
                  if inp.prompt is not None else await t.chat(inp, parsed.add_special, parsed.wants_pieces))
        resp.media = tokenize_answer(parsed, tokens.model_id, tokens.ids, tokens.pieces, tokens.window)


class Detokenize:
    def __init__(self, tokenization: Tokenization) -> None:
        self.tokenization = tokenization

    async def on_post(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        parsed = await parse_body(req, parse_detokenize)
        resp.media = detokenize_answer(*await self.tokenization.detokenize(parsed.params, parsed.tokens))


class ApplyTemplate:
    def __init__(self, tokenization: Tokenization) -> None:
        self.tokenization = tokenization

    async def on_post(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        inp = await parse_body(req, parse_apply_template)
        resp.media = template_answer(*await self.tokenization.template(inp))
