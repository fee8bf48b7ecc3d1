"""gmlx_plan/pace.py: the prefill pace fitted on computed spans (depth slope only where the spans show one), and
the Paces JSON that /v1/metrics publishes and gmlx plan reads back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gmlx_plan.pace import (
    FEW_ROWS,
    Paces,
    PrefillPace,
    fit_prefill,
    fit_step_depth,
    paces_from_json,
    paces_from_rates,
)
from gmlx_plan.queueing import Rates
from gmlx_plan.simulate import Backlog, ServerSide, replay


def test_a_prompt_of_same_depth_chunks_gives_a_flat_pace() -> None:
    # One cold 600-token prompt: two chunks, too few to read a slope from; its last chunk's overhead stays flat.
    pace = fit_prefill([(0, 512, 1.0), (512, 600, 0.3)])
    assert pace == PrefillPace(1.3 / 600)


@given(st.floats(1e-4, 1e-2), st.floats(0, 1e-6))
def test_a_long_prompt_recovers_the_depth_slope(a: float, b: float) -> None:
    truth = PrefillPace(a, b)
    chunks = [(s, s + 512, truth.seconds(s, s + 512)) for s in range(0, 4096, 512)]
    fit = fit_prefill(chunks)
    assert fit is not None
    assert fit.seconds(0, 8192) == pytest.approx(truth.seconds(0, 8192), rel=1e-6)


def test_spans_without_seconds_fit_nothing_and_a_negative_slope_falls_back_flat() -> None:
    assert fit_prefill([]) is None and fit_prefill([(0, 10, 0.0)]) is None
    slower_early = [(s, s + 512, 1.0 - s / 8192) for s in range(0, 4096, 512)]
    fit = fit_prefill(slower_early)
    assert fit is not None and fit.s_per_token_depth == 0.0
    assert fit.s_per_token == pytest.approx(sum(x for _, _, x in slower_early) / 4096)


def test_warm_tokens_at_the_restore_pace_cold_ones_at_their_depth() -> None:
    p = Paces(PrefillPace(0.01, 1e-5), {1: 0.1}, restore_tok_s=1000.0)
    assert p.prompt_s(300, 200) == pytest.approx(0.2 + PrefillPace(0.01, 1e-5).seconds(200, 300))
    assert p.prompt_s(300) == pytest.approx(300 * 0.01 + 1e-5 * 300 * 299 / 2)
    assert Paces(PrefillPace(0.01), {1: 0.1}).prompt_s(300, 200) == pytest.approx(1.0)  # unmeasured restores: free
    assert p.step(7) == 0.1


def test_paces_round_trip_through_their_json() -> None:
    p = Paces(PrefillPace(0.004, 2e-7), {1: 0.05, 4: 0.08}, 60000.0, 0.03, "http://h")
    assert paces_from_json(p.as_json(), "http://h") == p
    assert paces_from_json({"prefill_s_per_token": None, "decode_step_s": {}}, "x") is None
    flat = paces_from_rates(Rates(20.0, 200.0, 1.0))
    assert flat.prompt_s(400) == pytest.approx(2.0) and flat.step(3) == pytest.approx(0.05)


def test_the_decode_step_follows_the_batch_context() -> None:
    # Steps at width 2 timed at 600 to 3,600 KV tokens, 10 ms plus 5 us a token: the slope comes back.
    samples = {2: [(0.01 + 5e-6 * c, c) for c in range(600, 3601, 300)]}
    assert fit_step_depth(samples) == pytest.approx(5e-6)
    assert fit_step_depth({2: [(0.01, 600), (0.02, 610), (0.01, 605), (0.02, 600)]}) == 0.0  # no spread: no slope
    p = Paces(PrefillPace(0.01), {2: 0.02}, step_ctx={2: 1000.0}, step_s_per_ctx=5e-6)
    assert p.step(2) == 0.02 and p.step(2, 3000) == pytest.approx(0.03) and p.step(2, 0) == pytest.approx(0.015)
    assert paces_from_json(p.as_json(), "given") == p


def test_a_deep_batch_decodes_slower_in_the_replay() -> None:
    p = Paces(PrefillPace(0.01), {1: 0.02}, step_ctx={1: 100.0}, step_s_per_ctx=1e-5)
    server = ServerSide(1, 4)
    shallow = replay(Backlog([10], decoding_ctx=[100]), server, p).drain_s
    deep = replay(Backlog([10], decoding_ctx=[2100]), server, p).drain_s
    # 10 steps each: at 100 to 109 KV tokens about 20 ms, at 2100 and on 20 ms more.
    assert shallow == pytest.approx(10 * (0.02 + 1e-5 * 4.5)) and deep == pytest.approx(shallow + 10 * 0.02)


@given(st.floats(1e-4, 1e-2), st.floats(0, 1e-6), st.floats(1e-3, 0.05))
def test_short_tails_beside_whole_chunks_recover_the_chunk_cost(a: float, b: float, c: float) -> None:
    # Cold prompts in whole chunks and cache hits' short tails at every depth: the fixed cost per forward pass
    # comes back, so a 16-token tail is not priced as 16 tokens of a long chunk.
    truth = PrefillPace(a, b, c)
    spans = [(s, e, truth.seconds(s, e)) for s, e in
             [(0, 512), (512, 1024), (1024, 1300), (318, 334), (700, 701), (2000, 2040), (0, 334), (1500, 1520)]]
    fit = fit_prefill(spans)
    assert fit is not None
    assert fit.s_per_chunk == pytest.approx(c, rel=1e-4)
    assert fit.seconds(318, 334) == pytest.approx(truth.seconds(318, 334), rel=1e-4)


def test_the_chunk_cost_is_paid_per_chunk_and_read_back_from_json() -> None:
    p = PrefillPace(0.001, 0.0, 0.03)
    assert p.seconds(0, 16) == pytest.approx(0.03 + 0.016)
    assert p.seconds(0, 1100) == pytest.approx(3 * 0.03 + 1.1)  # 512 + 512 + 76 tokens: three passes
    assert p.seconds(5, 5) == 0.0
    paces = Paces(p, {1: 0.02})
    assert paces_from_json(paces.as_json(), "given") == paces


def test_spans_of_one_size_keep_no_chunk_cost() -> None:
    same = [(s, s + 334, 0.5) for s in range(0, 4 * 334, 334)]
    fit = fit_prefill(same)
    assert fit is not None and fit.s_per_chunk == 0.0


def test_chunks_under_few_rows_get_their_own_costs() -> None:
    # Long chunks run sgemm (38 ms + 3.6 ms a token), short ones the per-row tiles (10 ms + 6.2 ms a token), as
    # bench/plan_vs_real's traces showed: a 16-token warm tail priced on one line for all came out 1.5x cheap.
    long, short = PrefillPace(3.6e-3, 0.0, 0.038), PrefillPace(6.2e-3, 0.0, 0.010)
    spans = [(s, e, (long if e - s >= FEW_ROWS else short).seconds(s, e))
             for s, e in [(0, 334), (0, 158), (176, 334), (0, 512), (333, 334), (318, 334), (300, 332), (0, 8)]]
    fit = fit_prefill(spans)
    assert fit is not None and fit.few == pytest.approx((0.010, 6.2e-3))
    assert fit.seconds(318, 334) == pytest.approx(short.seconds(318, 334))
    assert fit.seconds(0, 334) == pytest.approx(long.seconds(0, 334), rel=0.05)
    # a 530-token prompt's last chunk is a short one
    assert fit.seconds(0, 530) == pytest.approx(fit.seconds(0, 512) + short.seconds(512, 530))
    assert paces_from_json(Paces(fit, {1: 0.02}).as_json(), "given") == Paces(fit, {1: 0.02})


def test_short_chunks_of_one_size_keep_one_line() -> None:
    # Cache hits' one-token tails beside cold prompts: too little to fit a second line.
    long = PrefillPace(3.6e-3, 0.0, 0.038)
    spans = [(0, 334, long.seconds(0, 334)), (0, 158, long.seconds(0, 158)), *[(333, 334, 0.016)] * 3,
             (0, 512, long.seconds(0, 512))]
    fit = fit_prefill(spans)
    assert fit is not None and fit.few is None and fit.s_per_chunk > 0
    # Short prompts of 38 to 40 tokens (bench/fleet.py's) only: two points that close would make a slope of noise.
    close = fit_prefill([(0, k, 0.2 + 0.001 * (k % 2)) for k in (38, 39, 40, 38, 40)])
    assert close is not None and close.few is None
