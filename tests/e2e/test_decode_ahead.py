"""A forward pass queued ahead, on the last step's tokens while they are still on the device, gives exactly the
tokens the settled loop gives: rows ending at different steps (length, a stop string), a seeded sampled row,
rows the host steers at their own step (a grammar, a thinking budget's forced tokens, penalties, a top_p draw),
a row joining and a row cancelled while a pass is queued. A row that reads logprobs never queues."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from gmlx_server.engine import batch as batch_mod
from gmlx_server.engine.loader import load_gguf_model
from gmlx_server.engine.mlx_engine import MLXEngine
from gmlx_server.engine.structured import json_grammar
from gmlx_server.engine.types import GenerationRequest, SamplingParams, ThinkingControl, TokenEvent
from tests.conftest import smollm2_path

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def engine() -> Iterator[MLXEngine]:
    eng = MLXEngine(lambda: load_gguf_model(smollm2_path()), decode_batch=4)
    yield eng
    eng.close()


def _ids(engine: MLXEngine, text: str) -> list[int]:
    return engine.tokenizer.encode(engine.template.render([{"role": "user", "content": text}]),
                                   add_special_tokens=False)


def _requests(engine: MLXEngine) -> list[GenerationRequest]:
    story = _ids(engine, "Write a long story about a lighthouse keeper.")
    return [GenerationRequest("long", story, 40, GREEDY),
            GenerationRequest("short", _ids(engine, "Name three colors."), 7, GREEDY),
            GenerationRequest("stop", story, 40, GREEDY, stop=("keeper",)),
            GenerationRequest("seeded", _ids(engine, "2+2?"), 24, SamplingParams(temperature=0.8, seed=7))]


def _tokens(events: list[TokenEvent]) -> tuple[list[int], str | None]:
    return [e.token_id for e in events if e.token_id is not None], events[-1].finish_reason


async def _collect(engine: MLXEngine, req: GenerationRequest) -> list[TokenEvent]:
    return [ev async for ev in engine.submit(req)]


def _together(engine: MLXEngine, reqs: list[GenerationRequest]) -> list[tuple[list[int], str | None]]:
    async def go() -> list[list[TokenEvent]]:
        return list(await asyncio.gather(*[_collect(engine, r) for r in reqs]))

    return [_tokens(evs) for evs in asyncio.run(go())]


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """After every decode step: whether it left a step queued ahead."""
    seen: list[bool] = []
    real = batch_mod.BatchDecoder.step

    def step(self: batch_mod.BatchDecoder, ahead: bool = False) -> None:
        real(self, ahead)
        seen.append(not self.settled)

    monkeypatch.setattr(batch_mod.BatchDecoder, "step", step)
    return seen


def _settled_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch_mod.BatchDecoder, "_queues_ahead", lambda self, plans: False)


def test_queued_steps_give_the_settled_loops_tokens(engine: MLXEngine, queued: list[bool],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    reqs = _requests(engine)
    ahead = _together(engine, reqs)
    assert any(queued), "no step was queued ahead"
    _settled_only(monkeypatch)
    queued.clear()
    settled = _together(engine, reqs)
    assert not any(queued)
    assert ahead == settled
    assert [reason for _, reason in ahead][:3] == ["length", "length", "stop"]  # the rows end at different steps


def test_a_row_joining_or_cancelled_while_a_step_is_queued(engine: MLXEngine, queued: list[bool],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    long, short, *_ = _requests(engine)

    async def go() -> tuple[list[TokenEvent], list[TokenEvent], int]:
        first: list[TokenEvent] = []
        handle = engine.submit(long)
        joiner: asyncio.Task[list[TokenEvent]] | None = None
        async for ev in handle:
            first.append(ev)
            if len(first) == 5:  # the batch is queuing ahead by now: the joiner waits for it to settle
                joiner = asyncio.ensure_future(_collect(engine, short))
            if joiner is not None and joiner.done():
                handle.cancel()
        assert joiner is not None
        return first, await joiner, len(first)

    first, joined, n = asyncio.run(go())
    assert first[-1].finish_reason == "cancelled" and n < long.max_tokens
    alone = _together(engine, [short])[0]
    assert _tokens(joined) == alone
    _settled_only(monkeypatch)
    assert _tokens(first)[0][: n - 1] == _together(engine, [long])[0][0][: n - 1]


def test_rows_the_host_steers_queue_and_keep_their_tokens(engine: MLXEngine, queued: list[bool],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    ids = _ids(engine, "Name three colors as JSON.")
    schema = {"type": "object", "properties": {"colors": {"type": "array", "items": {"type": "string"}}}}
    reqs = [GenerationRequest("grammar", ids, 24, GREEDY, grammar=json_grammar(schema)),
            GenerationRequest("budget", ids, 16, GREEDY, thinking=ThinkingControl(budget=3), starts_in_thinking=True),
            GenerationRequest("penalty", ids, 16, SamplingParams(temperature=0.0, repetition_penalty=1.3)),
            GenerationRequest("top_p", ids, 16, SamplingParams(temperature=0.7, top_p=0.9, seed=3))]
    ahead = _together(engine, reqs)
    assert any(queued)
    _settled_only(monkeypatch)
    assert ahead == _together(engine, reqs)
    assert "</think>" in engine.tokenizer.decode(ahead[1][0])  # the budget forced its close tag


def test_a_row_reading_logprobs_never_queues(engine: MLXEngine, queued: list[bool]) -> None:
    ids = _ids(engine, "Name three colors.")
    _together(engine, [GenerationRequest("lp", ids, 12, GREEDY, logprobs=True, top_logprobs=2)])
    assert queued and not any(queued)
