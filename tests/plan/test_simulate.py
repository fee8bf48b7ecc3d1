"""The fan-out simulation: deterministic, exact on one request, back-pressure when the queue is tiny."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gmlx_plan.queueing import Rates, retry_after_s
from gmlx_plan.simulate import Backlog, ServerSide, Workload, replay, simulate

RATES = Rates(decode_tok_s=20.0, prefill_tok_s=200.0, batch_scaling=0.9)


def _work(**kw: float) -> Workload:
    base = dict(waves=2, width=8, depth=600, output_tokens=40, think_s=3.0, spread_s=2.0, seed=7)
    return Workload(**{**base, **kw})  # type: ignore[arg-type]


def test_one_request_follows_the_model_exactly() -> None:
    r = simulate(Workload(1, 1, 1000, 11), ServerSide(4, 16, prefill_chunk=512), RATES)
    (o,) = r.outcomes
    assert o.status == "completed" and o.ttft == pytest.approx(1000 / 200.0)
    assert o.done == pytest.approx(1000 / 200.0 + 10 / 20.0)  # the first token comes from prefill
    assert r.drain_s == pytest.approx(o.done)


def test_deterministic_with_a_seed() -> None:
    server = ServerSide(4, 2)
    a, b = simulate(_work(), server, RATES), simulate(_work(), server, RATES)
    assert a == b
    assert simulate(_work(seed=8), server, RATES).outcomes != a.outcomes


def test_with_capacity_for_everything_there_are_no_503s() -> None:
    r = simulate(_work(waves=3), ServerSide(decode_batch=4, queue_cap=64), RATES)
    assert all(o.status == "completed" and not o.retry_afters for o in r.outcomes)
    assert len(r.outcomes) == 24


def test_a_tiny_queue_cap_gives_503s_and_every_request_ends() -> None:
    r = simulate(_work(width=16, spread_s=0.5), ServerSide(decode_batch=2, queue_cap=1), RATES)
    ras = [ra for o in r.outcomes for ra in o.retry_afters]
    assert ras and all(2 <= ra <= 60 for ra in ras)
    assert {o.status for o in r.outcomes} <= {"completed", "gave_up"}
    assert len(r.outcomes) == 32 and all(o.done is not None for o in r.outcomes)
    few = simulate(_work(width=16, spread_s=0.5, max_retries=0), ServerSide(2, 1), RATES)
    gave_up = [o for o in few.outcomes if o.status == "gave_up"]
    assert gave_up and all(len(o.retry_afters) == 1 and o.accepted is None for o in gave_up)
    assert sum(o.status == "completed" for o in few.outcomes) + len(gave_up) == 32


def test_drain_time_grows_with_waves() -> None:
    server = ServerSide(decode_batch=4, queue_cap=4)
    drains = [simulate(_work(waves=k), server, RATES).drain_s for k in (1, 2, 3, 4)]
    assert drains == sorted(drains) and len(set(drains)) == 4


def test_a_request_whose_geometry_fails_gets_400() -> None:
    r = simulate(_work(), ServerSide(4, 8, geometry_ok=False), RATES)
    assert {o.status for o in r.outcomes} == {"rejected_400"} and r.drain_s >= 3.0  # waves still follow


def test_memory_limits_the_decode_slots() -> None:
    r = simulate(_work(width=8, spread_s=0.0), ServerSide(decode_batch=8, queue_cap=64, slots=2), RATES)
    assert r.slots == 2 and max(e for _, e, _ in r.timeline) <= 2


def test_retry_after_is_the_drain_eta_clamped() -> None:
    assert retry_after_s(0.1) == 2 and retry_after_s(7.2) == 8 and retry_after_s(500) == 60
    # Three rows decode 100 tokens at width 3; then one waiting 400-token prompt prefills alone and decodes 1.
    server = ServerSide(4, 8)
    assert replay(Backlog([100, 100, 100]), server, RATES).drain_s == pytest.approx(100 * RATES.step_s(3))
    alone = replay(Backlog((), None, [(400, 0, 1)]), server, RATES)
    assert alone.drain_s == pytest.approx(2.0 + RATES.step_s(1)) and alone.first_token_s == (pytest.approx(2.0),)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 12), st.integers(1, 2000), st.integers(1, 60), st.integers(1, 6),
       st.integers(0, 6), st.floats(0, 5), st.integers(0, 50))
def test_invariants(waves: int, width: int, depth: int, out: int, batch: int, cap: int, spread: float,
                    seed: int) -> None:
    r = simulate(Workload(waves, width, depth, out, 1.0, spread, seed, max_retries=3),
                 ServerSide(batch, cap, prefill_chunk=256), RATES)
    assert len(r.outcomes) == waves * width
    assert all(o.status in ("completed", "gave_up") and o.done is not None for o in r.outcomes)
    assert max(e for _, e, _ in r.timeline) <= batch
    for o in r.outcomes:
        if o.status == "completed":
            assert o.ttft is not None and o.ttft >= depth / RATES.prefill_tok_s - 1e-9
            assert o.queue_wait is not None and o.queue_wait >= 0


def test_a_join_costs_the_step_after_it() -> None:
    from gmlx_plan.pace import Paces, PrefillPace

    plain = Paces(PrefillPace(0.01), {1: 0.1, 2: 0.1})
    joins = Paces(PrefillPace(0.01), {1: 0.1, 2: 0.1}, join_s=0.05)
    # Two 100-token prompts, 3 decode tokens each after the first: two joins, each slowing the step after it.
    a = replay(Backlog((), None, [(100, 0, 3), (100, 0, 3)]), ServerSide(2, 4), plain)
    b = replay(Backlog((), None, [(100, 0, 3), (100, 0, 3)]), ServerSide(2, 4), joins)
    assert b.drain_s == pytest.approx(a.drain_s + 2 * 0.05)
    assert b.first_token_s[1] == pytest.approx(a.first_token_s[1] + 0.05)  # the first join delays the second prefill


def test_a_row_leaving_costs_the_step_after_it() -> None:
    from gmlx_plan.pace import Paces, PrefillPace

    plain = Paces(PrefillPace(0.01), {1: 0.1, 2: 0.1})
    leaves = Paces(PrefillPace(0.01), {1: 0.1, 2: 0.1}, leave_s=0.03)
    # Rows with 2 and 5 tokens left: the first leaves after step 2, and step 3 filters the batch; the last
    # row's leaving empties the batch, which filters nothing.
    a = replay(Backlog((2, 5)), ServerSide(2, 4), plain)
    b = replay(Backlog((2, 5)), ServerSide(2, 4), leaves)
    assert b.drain_s == pytest.approx(a.drain_s + 0.03)


def test_a_queued_prompt_behind_its_shared_prefix_is_replayed_warm() -> None:
    from gmlx_plan.pace import Paces, PrefillPace

    paces = Paces(PrefillPace(0.1), {1: 0.1}, restore_tok_s=1e6)
    # Four 300-token prompts at once, one slot, one queue place: the third is refused while the first two wait.
    # The second starts behind the first, so it restores the 290 shared tokens and prefills 10 (1 s, not 30).
    warm = simulate(Workload(1, 4, 300, 2, shared_prefix=290), ServerSide(1, 1), paces)
    cold = simulate(Workload(1, 4, 300, 2), ServerSide(1, 1), paces)
    assert warm.outcomes[2].retry_afters[0] == retry_after_s(30 + 1 + 2 * 0.1 + 1e-3)
    assert cold.outcomes[2].retry_afters[0] == 60  # two cold prompts: 60 s and more
