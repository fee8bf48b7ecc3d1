"""A decode step that builds the next one's forward pass ahead (BatchDecoder.step(ahead=True)): the same tokens
as stepping one at a time, through rows leaving (their logits built ahead leave with them), a cancelled row,
a sampled row, and no forward built past every row's last token."""

from __future__ import annotations

from typing import Any

import pytest

from gmlx_server.engine import loader
from gmlx_server.engine.batch import BatchDecoder
from gmlx_server.engine.request_run import Progress, RequestRun
from gmlx_server.engine.types import GenerationRequest, SamplingParams, TokenEvent
from tests.conftest import smollm2_path

PROMPTS = ("The capital of France is", "List three colours:", "def add(a, b):")


@pytest.fixture(scope="module")
def lm() -> Any:
    return loader.load_gguf_model(smollm2_path())


def _prefilled(lm: Any, i: int, cap: int, params: SamplingParams, events: list[TokenEvent],
               cancelled: Any) -> RequestRun:
    req = GenerationRequest(f"r{i}", lm.tokenizer.encode(PROMPTS[i % len(PROMPTS)]), cap, params)
    run = RequestRun(lm.model, lm.tokenizer, req, events.append, cancelled, Progress(), caches=lm.make_cache)
    while not run.prefilled:
        assert not run.prefill_step()
    return run


def _batch(lm: Any, caps: tuple[int, ...], params: SamplingParams,
           cancel: dict[str, bool]) -> tuple[BatchDecoder, dict[str, list[TokenEvent]]]:
    batch, events = BatchDecoder(lm.model), {}
    for i, cap in enumerate(caps):
        events[f"r{i}"] = []
        batch.add(_prefilled(lm, i, cap, params, events[f"r{i}"], lambda r=f"r{i}": cancel.get(r, False)))
    return batch, events


def _decode(lm: Any, caps: tuple[int, ...], ahead: bool, params: SamplingParams,
            cancel_at: int | None = None) -> tuple[dict[str, list[int | None]], int]:
    """Every row's tokens, and how many steps built a forward ahead."""
    cancel: dict[str, bool] = {}
    batch, events = _batch(lm, caps, params, cancel)
    steps = built = 0
    while len(batch):
        if steps == cancel_at:
            cancel["r1"] = True
            batch.cancel_requested()
        batch.step(ahead=ahead)
        built += batch.ahead
        steps += 1
    assert not batch.ahead
    return {r: [e.token_id for e in evs] for r, evs in events.items()}, built


@pytest.mark.parametrize("case", range(3))
def test_ahead_gives_the_same_tokens(lm: Any, case: int) -> None:
    caps = ((6,), (3, 7, 5), (9, 4))[case]
    params = SamplingParams(temperature=0.0) if case < 2 else SamplingParams(temperature=0.8, top_p=0.9, seed=5)
    want, _ = _decode(lm, caps, False, params)
    got, built = _decode(lm, caps, True, params)
    assert got == want
    assert [len(v) for v in got.values()] == list(caps)  # every row ran to its own cap
    assert built == max(caps) - 2  # a step after the first token's, and none past the last row's cap


def test_a_cancelled_row_leaves_with_its_ahead_logits(lm: Any) -> None:
    greedy = SamplingParams(temperature=0.0)
    want, _ = _decode(lm, (6, 8, 5), False, greedy, cancel_at=3)
    got, _ = _decode(lm, (6, 8, 5), True, greedy, cancel_at=3)
    assert got == want and len(got["r1"]) < 8


def test_a_row_cannot_join_over_a_forward_built_ahead(lm: Any) -> None:
    greedy = SamplingParams(temperature=0.0)
    batch, _ = _batch(lm, (8,), greedy, {})
    late = _prefilled(lm, 1, 4, greedy, [], lambda: False)
    batch.step(ahead=True)
    with pytest.raises(AssertionError):
        batch.add(late)
    batch.step()  # takes the forward built ahead; then the row may join
    batch.add(late)
    assert len(batch) == 2
