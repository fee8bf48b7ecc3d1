"""No request can stop the engine: a failure injected at each stage of one request inside the real engine
thread (SmolLM2) ends that request with an error while the requests beside it finish with the text they
give without the fault, and the engine goes on serving. A thread killed outright is reported by `fault`
and every request it held gets its final event."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gmlx_server.engine import batch as batch_mod
from gmlx_server.engine import request_run as generate_mod
from gmlx_server.engine import scheduler as scheduler_mod
from gmlx_server.engine import structured as structured_mod
from gmlx_server.engine.loader import load_gguf_model
from gmlx_server.engine.mlx_engine import MLXEngine
from gmlx_server.engine.structured import json_grammar
from gmlx_server.engine.types import EngineClosed, GenerationRequest, SamplingParams, TokenEvent
from tests.conftest import smollm2_path

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(temperature=0.0)
VICTIM = "victim"
QUESTIONS = ("What is the capital of France?", "Name a primary colour.", "What is two plus two?")
TOKENS = 8


class Injected(RuntimeError):
    """The fault the tests plant."""


@pytest.fixture(scope="module")
def engine() -> Iterator[MLXEngine]:
    eng = MLXEngine(lambda: load_gguf_model(smollm2_path(), "smollm2"), decode_batch=4)
    yield eng
    eng.close()


def _ids(engine: MLXEngine, text: str) -> list[int]:
    rendered = engine.template.render([{"role": "user", "content": text}], add_generation_prompt=True)
    return engine.tokenizer.encode(rendered, add_special_tokens=False)


def _requests(engine: MLXEngine, victim: GenerationRequest | None = None) -> list[GenerationRequest]:
    """Two bystanders, then the victim between two more: the victim decodes in a batch with others."""
    reqs = [GenerationRequest(f"ok{i}", _ids(engine, q), TOKENS, GREEDY) for i, q in enumerate(QUESTIONS)]
    return [*reqs[:2], victim, reqs[2]] if victim is not None else reqs


def _victim(engine: MLXEngine, **kw: Any) -> GenerationRequest:
    return GenerationRequest(VICTIM, _ids(engine, "Tell me a story about a dragon."), TOKENS, GREEDY, **kw)


def _run_all(engine: MLXEngine, reqs: list[GenerationRequest]) -> dict[str, list[TokenEvent]]:
    async def one(req: GenerationRequest) -> tuple[str, list[TokenEvent]]:
        return req.request_id, [ev async for ev in engine.submit(req)]

    async def go() -> dict[str, list[TokenEvent]]:
        return dict(await asyncio.wait_for(asyncio.gather(*(one(r) for r in reqs)), timeout=120))

    return asyncio.run(go())


def _text(events: list[TokenEvent]) -> str:
    return "".join(e.text for e in events)


@pytest.fixture(scope="module")
def baseline(engine: MLXEngine) -> dict[str, str]:
    return {rid: _text(evs) for rid, evs in _run_all(engine, _requests(engine)).items()}


def _assert_only_victim_failed(engine: MLXEngine, baseline: dict[str, str], victim: GenerationRequest) -> str:
    out = _run_all(engine, _requests(engine, victim))
    final = out[VICTIM][-1]
    assert final.finish_reason == "error" and final.error and "Injected" in final.error, final
    for rid, text in baseline.items():
        assert out[rid][-1].finish_reason in ("stop", "length"), (rid, out[rid][-1])
        assert _text(out[rid]) == text, rid
    assert engine.fault is None
    after = _run_all(engine, _requests(engine))  # and it keeps serving, fault or not
    assert {rid: _text(evs) for rid, evs in after.items()} == baseline
    assert engine.stats().in_flight == engine.stats().waiting == 0
    return final.error


def _for_victim(original: Callable[..., Any], when: Callable[[Any], bool] = lambda seq: True) -> Callable[..., Any]:
    def wrapper(self: Any, *args: Any, **kw: Any) -> Any:
        if self.req.request_id == VICTIM and when(self):
            raise Injected(f"planted in {original.__name__}")
        return original(self, *args, **kw)

    return wrapper


def test_a_request_that_cannot_be_constructed_fails_alone(engine: MLXEngine, baseline: dict[str, str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    real = generate_mod.RequestRun

    def build(model: Any, tokenizer: Any, req: GenerationRequest, *args: Any, **kw: Any) -> Any:
        if req.request_id == VICTIM:
            raise Injected("planted in RequestRun()")
        return real(model, tokenizer, req, *args, **kw)

    monkeypatch.setattr(scheduler_mod, "RequestRun", build)
    _assert_only_victim_failed(engine, baseline, _victim(engine))


def test_a_failing_prefill_chunk_fails_alone(engine: MLXEngine, baseline: dict[str, str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generate_mod.RequestRun, "prefill_step", _for_victim(generate_mod.RequestRun.prefill_step))
    _assert_only_victim_failed(engine, baseline, _victim(engine))


def test_a_failing_decode_step_is_recomputed_for_the_others(engine: MLXEngine, baseline: dict[str, str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared forward pass fails whenever the victim is in the batch past its third token, after it has
    advanced every row's KV cache: the batch is rebuilt by recomputation and the victim found by probation."""
    real = batch_mod.BatchDecoder.step

    def step(self: Any, ahead: bool = False) -> None:
        victim = next((s for s in self.rows if s.req.request_id == VICTIM), None)
        if victim is not None and len(victim.output) >= 3:
            self.model(batch_mod.mx.array([[s.next_input] for s in self.rows]), cache=self._cache)
            raise Injected("planted in the batched forward pass")
        real(self, ahead)

    monkeypatch.setattr(batch_mod.BatchDecoder, "step", step)
    assert "decode step failed" in _assert_only_victim_failed(engine, baseline, _victim(engine))


def test_a_failing_sampler_fails_alone(engine: MLXEngine, baseline: dict[str, str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    draw = _for_victim(generate_mod.RequestRun.draw, lambda seq: len(seq.output) >= 2)  # in decode, not prefill
    monkeypatch.setattr(generate_mod.RequestRun, "draw", draw)
    _assert_only_victim_failed(engine, baseline, _victim(engine))


def test_a_failing_detokenizer_fails_alone(engine: MLXEngine, baseline: dict[str, str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    feed = _for_victim(generate_mod.RequestRun._feed, lambda seq: len(seq.output) >= 3)
    monkeypatch.setattr(generate_mod.RequestRun, "_feed", feed)
    _assert_only_victim_failed(engine, baseline, _victim(engine))


def test_a_failing_grammar_fails_alone(engine: MLXEngine, baseline: dict[str, str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    real = structured_mod.GrammarConstraint.consume
    seen = {"n": 0}

    def consume(self: Any, token: int) -> Any:
        seen["n"] += 1
        if seen["n"] >= 3:
            raise Injected("planted in the grammar")
        return real(self, token)

    monkeypatch.setattr(structured_mod.GrammarConstraint, "consume", consume)
    grammar = json_grammar({"type": "object"}, "json_object")
    _assert_only_victim_failed(engine, baseline, _victim(engine, grammar=grammar))


def test_seeds_outside_mlx_key_range_and_a_huge_top_k_are_served(engine: MLXEngine) -> None:
    """Once, `seed: -1` killed the engine thread from inside RequestRun(); now -1 means a random seed, any
    other integer is taken modulo 2**64, and a top_k above the vocabulary keeps every token."""
    ids = _ids(engine, "Hi")
    reqs = [GenerationRequest(f"s{i}", ids, 2, SamplingParams(temperature=0.8, seed=seed, top_k=top_k))
            for i, (seed, top_k) in enumerate([(-1, 0), (-(2**63), 0), (2**64 - 1, 10**9), (-5, 49153)])]
    out = _run_all(engine, reqs)
    assert all(evs[-1].finish_reason in ("stop", "length") for evs in out.values()), out
    twice = [_run_all(engine, [GenerationRequest(f"d{i}", ids, 4, SamplingParams(temperature=1.0, seed=-7))])
             for i in range(2)]
    assert _text(twice[0]["d0"]) == _text(twice[1]["d1"])  # a negative seed is still a seed


def test_a_killed_engine_thread_reports_its_fault_and_ends_every_request() -> None:
    """A BaseException gets past every per-request guard and the loop's own: the thread dies, says why,
    and the requests it held (decoding and queued) end with an error instead of hanging."""
    engine = MLXEngine(lambda: load_gguf_model(smollm2_path(), "smollm2"), decode_batch=2)
    try:
        armed = {"on": False}
        real = scheduler_mod.Scheduler._measure

        def measure(self: Any) -> None:
            if armed["on"] and len(self.batch):
                raise SystemExit("planted: the engine thread is killed")
            real(self)

        scheduler_mod.Scheduler._measure = measure  # type: ignore[method-assign]
        armed["on"] = True
        reqs = [GenerationRequest(f"k{i}", _ids(engine, q), 64, GREEDY) for i, q in enumerate(QUESTIONS)]
        out = _run_all(engine, reqs)
        assert all(evs[-1].finish_reason == "error" for evs in out.values()), out
        assert "SystemExit" in (out["k0"][-1].error or "")
        assert engine.fault is not None and "SystemExit" in engine.fault
        assert engine.stats().rows == ()
        with pytest.raises(EngineClosed):
            _run_all(engine, reqs[:1])
    finally:
        scheduler_mod.Scheduler._measure = real  # type: ignore[method-assign]
        engine.close()
    assert engine.fault is None  # closed on purpose: nothing to restart
