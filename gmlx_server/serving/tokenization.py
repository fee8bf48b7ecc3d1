"""The tokenizer routes' work: text or a chat prompt -> token ids, ids -> text, messages -> the rendered prompt.

Every answer comes from the tokenizer and template a generation would use (the resident engine's, else built
from the model's header by the Estimator, so nothing loads), and a chat prompt is rendered by the same
Rendering as /v1/estimate: their counts agree by construction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from gmlx_server.config import ServerConfig
from gmlx_server.errors import InvalidRequest, clip
from gmlx_server.generation_params import GenerationParams
from gmlx_server.serving.addressing import resolve_address
from gmlx_server.serving.estimate import Estimator, PromptTools
from gmlx_server.serving.generation import check_length
from gmlx_server.serving.model_host import ModelHost


@dataclass(frozen=True)
class Tokens:
    model_id: str
    ids: list[int]
    window: int  # the model's context window as served (max_model_len, n_ctx)
    pieces: list[bytes]  # each token's bytes when asked for, else empty


class NotAChatModel(InvalidRequest):
    """A service model's id (embeddings, rerank, speech) on a route that needs a chat model's tokenizer."""

    def __init__(self, model: str, kind: str) -> None:
        super().__init__(f"model '{clip(model)}' is the {kind} service, not a chat model: the tokenizer routes "
                         "serve the chat models under models:", param="model", code="not_a_chat_model")


def service_names(config: ServerConfig) -> dict[str, str]:
    """Every service id and alias -> its kind."""
    return {name: entry.kind for entry in config.services.values() for name in (entry.id, *entry.aliases)}


def check_ids(ids: Sequence[int], vocab_size: int, model_id: str) -> None:
    """Every id names a token of the model's vocabulary: the first that does not is a 400 naming its place."""
    for i, token in enumerate(ids):
        if not 0 <= token < vocab_size:
            raise InvalidRequest(f"'tokens[{i}]': {token} is not a token id of model '{model_id}' (its vocabulary "
                                 f"holds ids 0 to {vocab_size - 1})", param=f"tokens[{i}]", code="invalid_token_id")


class Tokenization:
    def __init__(self, host: ModelHost, estimator: Estimator) -> None:
        self.host, self.estimator = host, estimator

    def _chat_model(self, inp: GenerationParams) -> None:
        kind = service_names(self.host.config).get(inp.model)
        if kind is not None:
            raise NotAChatModel(inp.model, kind)

    async def _tools(self, inp: GenerationParams) -> tuple[str, PromptTools]:
        self._chat_model(inp)
        model_id = resolve_address(inp.model, inp.profile, self.host.catalog).model_id
        return model_id, (await self.estimator.tools(model_id))[0]

    async def text(self, inp: GenerationParams, add_special: bool, pieces: bool, param: str) -> Tokens:
        """`inp.prompt` as the tokenizer splits it, with its BOS/EOS when `add_special`."""
        model_id, tools = await self._tools(inp)
        text = inp.prompt or ""

        def work() -> list[int]:
            check_length(text, tools.tokenizer, model_id, tools.context_length, param)
            return tools.tokenizer.encode(text, add_special)

        return _tokens(model_id, tools, await asyncio.to_thread(work), pieces)

    async def chat(self, inp: GenerationParams, add_special: bool, pieces: bool) -> Tokens:
        """The chat prompt a generation would send; `add_special` adds the tokenizer's own BOS/EOS besides the
        template's (a generation adds none)."""
        self._chat_model(inp)
        r = await self.estimator.rendering(inp)

        def work() -> list[int]:
            text, ids = r.tokenize()
            return r.tools.tokenizer.encode(text, True) if add_special else ids

        return _tokens(r.model_id, r.tools, await asyncio.to_thread(work), pieces)

    async def template(self, inp: GenerationParams) -> tuple[str, str]:
        """(model id, the rendered prompt): the chat template's text, images still placeholders."""
        self._chat_model(inp)
        r = await self.estimator.rendering(inp)
        return r.model_id, await asyncio.to_thread(r.render)

    async def detokenize(self, inp: GenerationParams, ids: Sequence[int]) -> tuple[str, str]:
        """(model id, the text of `ids`), every id checked against the model's vocabulary first."""
        model_id, tools = await self._tools(inp)
        check_ids(ids, tools.tokenizer.vocab_size, model_id)
        return model_id, await asyncio.to_thread(tools.tokenizer.decode, ids)


def _tokens(model_id: str, tools: PromptTools, ids: list[int], pieces: bool) -> Tokens:
    return Tokens(model_id, ids, tools.context_length,
                  [tools.tokenizer.token_bytes(i) for i in ids] if pieces else [])
