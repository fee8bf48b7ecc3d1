"""Rerank with a chat model: the probability that it answers "yes" when asked whether a document meets the
query (the approach of LLM rerankers such as Qwen3-Reranker), through the chat host's public interface.

One greedy token per document, with the yes/no tokens lifted by a logit bias so they hold all the mass: the
score is P(yes) / (P(yes) + P(no)) summed over the casings that are single tokens. Documents are scored as
concurrent requests (the engine batches them), at most the engine's decode width at a time.
"""

from __future__ import annotations

import asyncio
import math
import uuid

from gmlx_server.auxiliary.rerank import RerankRequest
from gmlx_server.engine.types import GenerationRequest, SamplingParams, Tokenizer
from gmlx_server.errors import EngineFailure, InvalidRequest
from gmlx_server.generation_params import GenerationParams
from gmlx_server.serving.generation import prepare_prompt
from gmlx_server.serving.model_host import ModelHost
from gmlx_server.serving.request_log import OutputCap, RequestRecord

SYSTEM = ('Judge whether the Document meets the requirements based on the Query. Note that the answer can only '
          'be "yes" or "no".')
BIAS = 100.0  # lifts yes/no over every other token without changing their ratio
YES, NO = ("yes", "Yes", "YES"), ("no", "No", "NO")


def answer_tokens(tokenizer: Tokenizer) -> tuple[set[int], set[int]]:
    """Token ids of the single-token spellings of yes and no (with and without a leading space)."""
    def ids(words: tuple[str, ...]) -> set[int]:
        found = set()
        for w in words:
            for text in (w, " " + w):
                toks = tokenizer.encode(text, add_special_tokens=False)
                if len(toks) == 1:
                    found.add(toks[0])
        return found

    yes, no = ids(YES), ids(NO)
    if not yes or not no:
        raise InvalidRequest("the rerank model's vocabulary has no single token for yes or no", param="model")
    return yes, no


async def llm_scores(host: ModelHost, model_id: str, req: RerankRequest) -> tuple[list[float], int]:
    """(P(yes) per document, prompt tokens read)."""
    engine = await host.engine(model_id)
    yes, no = answer_tokens(engine.tokenizer)
    width = asyncio.Semaphore(max(1, engine.stats().decode_batch))

    async def one(doc: str) -> tuple[float, int]:
        async with width:
            return await _score(host, model_id, req.query, doc, yes, no)

    results = await asyncio.gather(*(one(d) for d in req.documents))
    return [s for s, _ in results], sum(n for _, n in results)


async def _score(host: ModelHost, model_id: str, query: str, doc: str, yes: set[int], no: set[int],
                 ) -> tuple[float, int]:
    messages = ({"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"<Query>: {query}\n<Document>: {doc}"})
    prompt = await prepare_prompt(host, GenerationParams(model=model_id, messages=messages))
    bias = dict.fromkeys(yes | no, BIAS)
    request = GenerationRequest(f"rerank-{uuid.uuid4().hex[:16]}", prompt.ids, max_tokens=1,
                                sampling=SamplingParams(temperature=0.0, logit_bias=bias), logprobs=True,
                                top_logprobs=len(bias))
    host.capacity.preflight(model_id, len(prompt.ids), 1)  # the memory 400 a generation gets
    record = RequestRecord("/v1/rerank", request_id=request.request_id)
    record.started(model_id, None, len(prompt.ids), OutputCap(1, None), prompt.text)
    tops: dict[int, float] = {}
    status = 500
    try:
        async for event in host.start(model_id, prompt.engine, request, record.finished):
            if event.error:
                raise EngineFailure(f"scoring with model '{model_id}' failed: {event.error}")
            tops.update(event.top_logprobs)
        status = 200
    except EngineFailure as e:
        record.refused(e)
        raise
    finally:
        record.emit(status)  # each scored document is a line
    p_yes = sum(math.exp(tops[t]) for t in yes if t in tops)
    p_no = sum(math.exp(tops[t]) for t in no if t in tops)
    return (p_yes / (p_yes + p_no) if p_yes + p_no > 0 else 0.0), len(prompt.ids)
