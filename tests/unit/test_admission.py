"""Admission, drain estimate, governor bands and shed, on a scripted slot engine (no MLX)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gmlx_plan.queueing import retry_after_s, step_time
from gmlx_server.config import RuntimeEnv
from gmlx_server.engine.types import EngineStats, GenerationRequest, RequestRow, Timings, TokenEvent
from gmlx_server.errors import ServerOverloaded
from gmlx_server.serving.admission import Admission, drain_eta_s, queue_cap, ttft_s
from gmlx_server.serving.governor import Governor, band_for, largest_stream
from gmlx_server.serving.memory_probes import MemoryReading
from gmlx_server.serving.telemetry import ModelRates, Telemetry


class SlotHandle:
    def __init__(self, rid: str) -> None:
        self.request_id = rid
        self.events: list[TokenEvent] = []
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        async def gen() -> AsyncIterator[TokenEvent]:
            for e in self.events:
                yield e

        return gen()


class SlotEngine:
    """Width slots; `step()` moves queued requests into free slots and advances each by one token."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.queued: list[tuple[GenerationRequest, SlotHandle]] = []
        self.running: dict[str, tuple[GenerationRequest, SlotHandle, int]] = {}
        self.shed_reasons: dict[str, str] = {}

    def submit(self, req: GenerationRequest) -> SlotHandle:
        h = SlotHandle(req.request_id)
        self.queued.append((req, h))
        return h

    def step(self) -> None:
        for rid, (req, h, n) in list(self.running.items()):
            if rid in self.shed_reasons:
                self._end(rid, "shed")
            elif h.cancelled:
                self._end(rid, "cancelled")
            elif n + 1 >= req.max_tokens:
                self._end(rid, "length")
            else:
                self.running[rid] = (req, h, n + 1)
        while self.queued and len(self.running) < self.width:
            req, h = self.queued.pop(0)
            self.running[req.request_id] = (req, h, 0)

    def _end(self, rid: str, reason: str) -> None:
        _, h, _ = self.running.pop(rid)
        h.events.append(TokenEvent("", None, finish_reason=reason))  # type: ignore[arg-type]

    def stats(self) -> EngineStats:
        rows = [RequestRow(r.request_id, "queued", len(r.prompt_tokens), 0, r.max_tokens, 0.0, None, None)
                for r, _ in self.queued]
        rows += [RequestRow(r.request_id, "decode", len(r.prompt_tokens), n, r.max_tokens, 0.0, None, None)
                 for r, _, n in self.running.values()]
        in_flight = min(self.width, len(rows))  # as MLXEngine counts: a queued request beside a free slot holds it
        return EngineStats(self.width, in_flight, len(rows) - in_flight, tuple(rows))

    def shed(self, rid: str, reason: str) -> bool:
        if rid not in self.running:
            return False
        self.shed_reasons[rid] = reason
        return True


ops = st.lists(st.sampled_from(["arrive", "arrive", "arrive", "step", "cancel", "shed"]), max_size=80)


@settings(max_examples=60, deadline=None)
@given(ops, st.integers(1, 4), st.integers(0, 6), st.integers(1, 6))
def test_random_arrivals_keep_invariants_and_end_every_request_once(script: list[str], width: int, cap: int,
                                                                    length: int) -> None:
    engine = SlotEngine(width)
    admission = Admission(RuntimeEnv(queue_depth_cap=cap), Telemetry())
    handles: dict[str, SlotHandle] = {}
    rejected: set[str] = set()
    for i, op in enumerate(script):
        if op == "arrive":
            rid = f"r{i}"
            try:
                admission.admit("m", engine.stats())
            except ServerOverloaded as e:
                assert e.status == 503 and 2 <= int(e.headers["Retry-After"]) <= 60
                rejected.add(rid)
                continue
            handles[rid] = engine.submit(GenerationRequest(rid, [1, 2, 3], length))
        elif op == "step":
            engine.step()
        elif op == "cancel" and handles:
            next(iter(handles.values())).cancel()
        elif op == "shed" and (choice := largest_stream({"m": engine})):  # type: ignore[dict-item]
            engine.shed(choice.request_id, "test")
        s = engine.stats()
        assert s.in_flight <= width and s.waiting <= cap  # the figure /v1/metrics shows never passes the cap
    for _ in range(len(script) * (length + 1) + 1):  # drain
        engine.step()
    for rid, h in handles.items():
        finals = [e for e in h.events if e.finish_reason]
        assert len(finals) == 1, rid
    assert not (rejected & handles.keys())
    assert admission.telemetry.rejections["queue_full"] == len(rejected)


def test_queue_cap_defaults_to_twice_the_width_and_env_overrides() -> None:
    s = EngineStats(4, 4, 0)
    assert queue_cap(RuntimeEnv(), s) == 8
    assert queue_cap(RuntimeEnv(queue_depth_cap=3), s) == 3


def test_retry_after_is_the_drain_estimate_clamped() -> None:
    assert retry_after_s(0.1) == 2 and retry_after_s(30.2) == 31 and retry_after_s(1e6) == 60
    rows = tuple(RequestRow(f"r{i}", "decode", 10, 0, 100, 0, None, None) for i in range(2))
    # 2 rows x 100 tokens left at the 5 tok/s fallback over 2 streams: 20 s.
    assert drain_eta_s(EngineStats(2, 2, 0, rows), None) == pytest.approx(20.0)


def _reading(free: int, total: int = 1000) -> MemoryReading:
    return MemoryReading(total, free, None, None, None, True)


@pytest.mark.parametrize("free, band", [(500, "green"), (250, "green"), (200, "yellow"), (100, "orange"),
                                        (49, "red"), (0, "red")])
def test_bands_are_fractions_of_the_budget(free: int, band: str) -> None:
    assert band_for(_reading(free)) == band


def test_a_failing_probe_gives_no_band() -> None:
    assert band_for(MemoryReading(None, None, None, None, None, False)) is None


def test_red_sheds_the_largest_stream_and_counts_it() -> None:
    engine = SlotEngine(3)
    for i, n in enumerate((5, 50, 20)):
        engine.submit(GenerationRequest(f"r{i}", list(range(n)), 10))
    engine.step()
    gov = Governor(True, lambda: _reading(10))
    assert gov.evaluate({"m": engine}) == "red"  # type: ignore[dict-item]
    assert engine.shed_reasons.keys() == {"r1"} and gov.sheds == 1 and gov.pressure
    engine.step()
    assert set(engine.running) == {"r0", "r2"}  # r1 left the batch, the others still run


def test_one_shed_at_a_time_until_the_victim_is_gone() -> None:
    engine = SlotEngine(2)
    for i, n in enumerate((5, 50)):
        engine.submit(GenerationRequest(f"r{i}", list(range(n)), 10))
    engine.step()
    gov = Governor(True, lambda: _reading(10))
    gov.evaluate({"m": engine})  # type: ignore[dict-item]
    gov.evaluate({"m": engine})  # r1 not gone yet: no second victim
    assert engine.shed_reasons.keys() == {"r1"} and gov.sheds == 1
    engine.step()  # r1 leaves
    gov.evaluate({"m": engine})  # one settling reading after the victim left
    assert gov.sheds == 1
    gov.evaluate({"m": engine})  # still red with r1 gone: now r0 goes
    assert engine.shed_reasons.keys() == {"r0", "r1"} and gov.sheds == 2


def test_governor_off_reports_bands_but_never_sheds() -> None:
    engine = SlotEngine(1)
    engine.submit(GenerationRequest("r0", [1], 10))
    engine.step()
    gov = Governor(False, lambda: _reading(0))
    assert gov.evaluate({"m": engine}) == "red" and not engine.shed_reasons and not gov.pressure  # type: ignore[dict-item]


def test_telemetry_tracks_recent_and_lifetime_rates() -> None:
    tel = Telemetry(clock=lambda: 10.0)
    for gen in (11, 21):
        tel.record_final("m", TokenEvent("", None, finish_reason="stop",
                                         timings=Timings(100, gen, 1.0, 2.0, 0.5, spans=((0, 100, 1.0),))), 9.0)
    m = tel.models["m"]
    assert m.prefill_tok_s_recent == 100.0
    assert m.decode_tok_s_recent == pytest.approx((5.0 + 10.0) / 2)
    assert m.decode_tok_s_lifetime == pytest.approx(30 / 4.0)
    assert tel.ttft.count == 2 and tel.latency.cumulative()[-1] == (float("inf"), 2)


def test_a_cache_hit_leaves_the_prefill_pace_alone_and_measures_the_restore() -> None:
    """A hit's reused tokens are no prefill: only the span it computed counts, and the restore has its own pace."""
    tel = Telemetry()
    cold = Timings(600, 2, 1.2, 0.1, 1.2, spans=((0, 512, 1.0), (512, 600, 0.2)))
    hit = Timings(600, 2, 0.03, 0.1, 0.03, cached_tokens=599, spans=((599, 600, 0.002),), restore_s=0.02)
    tel.record_final("m", TokenEvent("", None, finish_reason="stop", timings=cold), 0.0)
    before = tel.models["m"].prefill_tok_s_recent
    tel.record_final("m", TokenEvent("", None, finish_reason="stop", timings=hit), 0.0)
    m = tel.models["m"]
    assert before == pytest.approx(500.0) and m.prefill_tok_s_recent == pytest.approx(601 / 1.202)
    assert m.restore_tok_s_recent == pytest.approx(599 / 0.02)
    assert hit.prefill_tok_s == pytest.approx(500.0)  # what the response's timings report: 1 token in 2 ms


def test_a_disk_hit_is_timed_apart_and_estimated_at_its_own_pace() -> None:
    """A disk tier read is slower than a RAM copy: it has its own pace, and a disk hit's warm tokens take it."""
    tel = Telemetry()
    for tier, seconds in (("block", 0.01), ("disk", 0.5)):
        hit = Timings(600, 2, 0.03, 0.1, 0.03, cached_tokens=500, spans=((500, 600, 0.2),), restore_s=seconds,
                      cache_tier=tier)
        tel.record_final("m", TokenEvent("", None, finish_reason="stop", timings=hit), 0.0)
    m = tel.models["m"]
    assert m.restore_tok_s_recent == pytest.approx(500 / 0.01) and m.disk_restore_tok_s_recent == pytest.approx(1000)
    idle = EngineStats(2, 0, 0, (), {1: 0.5})
    ram = ttft_s(idle, m, 600, 500, 16)
    assert ttft_s(idle, m, 600, 500, 16, disk=True) == pytest.approx(ram + 500 / 1000 - 500 / 50_000)
    assert ttft_s(idle, _rates(100.0), 600, 500, 16, disk=True) == ttft_s(idle, _rates(100.0), 600, 500, 16)


def test_tracked_handle_records_the_final_event_once() -> None:
    tel = Telemetry()
    h = SlotHandle("x")
    h.events = [TokenEvent("a", 1), TokenEvent("", None, finish_reason="stop")]

    async def drain() -> int:
        return len([e async for e in tel.track("m", h)])  # type: ignore[arg-type]

    assert asyncio.run(drain()) == 2 and tel.models["m"].finished["stop"] == 1


def test_step_time_interpolates_between_measured_widths() -> None:
    at = step_time({1: 0.1, 4: 0.25})
    assert (at(1), at(4), at(8)) == (0.1, 0.25, 0.25)
    assert at(2) == pytest.approx(0.15) and at(3) == pytest.approx(0.2)
    assert step_time({2: 0.1})(1) == 0.1  # below the measured widths: the nearest


def _rates(prefill_tok_s: float, restore_tok_s: float | None = None) -> ModelRates:
    m = ModelRates()
    m.spans.append((0, 100, 100 / prefill_tok_s))
    m.recent_prefill.append((100, 100 / prefill_tok_s))
    if restore_tok_s:
        m.recent_restore.append((100, 100 / restore_tok_s))
    return m


def test_the_measured_pace_drives_the_estimate() -> None:
    rows = (RequestRow("a", "decode", 10, 6, 16, 1.0, 0.1, 5.0), RequestRow("b", "queued", 50, 0, 16, 0.5, None, None))
    measured = EngineStats(1, 1, 1, rows, {1: 0.5})
    # a: 10 tokens left at 0.5 s; then b prefills 50 tokens (0.5 s): its first token, then 15 more (7.5 s).
    assert drain_eta_s(measured, _rates(100.0)) == pytest.approx(10 * 0.5 + 0.5 + 15 * 0.5)


def test_est_ttft_is_the_queue_then_warm_at_the_restore_pace_then_cold_at_the_prefill_pace() -> None:
    idle = EngineStats(2, 0, 0, (), {1: 0.5})
    rates = _rates(100.0, restore_tok_s=1000.0)
    assert ttft_s(idle, rates, 300, 0, 16) == pytest.approx(3.0)  # all cold
    assert ttft_s(idle, rates, 300, 200, 16) == pytest.approx(0.2 + 1.0)  # 200 restored, 100 prefilled
    # One row decodes beside it: a step (0.5 s) follows each 512-token chunk, so a 600-token cold prompt waits one.
    busy = EngineStats(2, 1, 0, (RequestRow("a", "decode", 10, 1, 50, 1.0, 0.1, 5.0),), {1: 0.5, 2: 0.5})
    assert ttft_s(busy, rates, 600, 0, 16) == pytest.approx(6.0 + 0.5)


def test_a_queued_row_is_replayed_with_the_warm_tokens_it_expects() -> None:
    rates = _rates(100.0, restore_tok_s=1000.0)
    queued = (RequestRow("q", "queued", 300, 0, 2, 0.5, None, None, expected_warm=200),)
    # 200 tokens restored (0.2 s), 100 prefilled (1 s), then its one decode token (0.5 s); cold it took 3.5 s.
    assert drain_eta_s(EngineStats(1, 1, 0, queued, {1: 0.5}), rates) == pytest.approx(0.2 + 1.0 + 0.5)


def test_est_ttft_queues_the_request_at_its_priority() -> None:
    rates = _rates(100.0)
    batch = tuple(RequestRow(f"b{i}", "queued", 300, 0, 2, 0.5, None, None, priority=5) for i in range(2))
    stats = EngineStats(1, 1, 1, batch, {1: 0.5})
    # Two batch-priority rows wait (3 s of prefill and a 0.5 s step each); a sooner request goes ahead of both.
    assert ttft_s(stats, rates, 100, 0, 2, priority=0) == pytest.approx(1.0)
    assert ttft_s(stats, rates, 100, 0, 2, priority=5) == pytest.approx(2 * (3.0 + 0.5) + 1.0)


def test_a_prefilling_row_is_replayed_from_where_it_is() -> None:
    row = RequestRow("a", "prefill", 400, 0, 2, 1.0, None, None, prefilled=300)
    stats = EngineStats(1, 1, 0, (row,), {1: 0.5})
    # 100 tokens left at 100 tok/s, then its one decode token.
    assert drain_eta_s(stats, _rates(100.0)) == pytest.approx(1.0 + 0.5)


def test_the_engine_pace_keeps_joins_and_depth_apart() -> None:
    from gmlx_server.engine.scheduler import Pace

    pace = Pace()
    for ctx in range(400, 4001, 400):
        pace.stepped(2, 0.01 + 2e-6 * ctx, ctx=ctx)
    pace.stepped(2, 0.5, joined=True, ctx=2000)  # the step that merged a joining row's cache
    assert pace.step_s[2] == pytest.approx(0.01 + 2e-6 * 2200) and pace.step_ctx[2] == 2200.0
    assert pace.step_s_per_ctx == pytest.approx(2e-6)
    assert pace.join_s == pytest.approx(0.5 - pace.step_s[2])


def test_the_step_after_a_row_left_is_kept_out_of_the_plain_medians() -> None:
    from gmlx_server.engine.scheduler import Pace

    pace = Pace()
    for _ in range(5):
        pace.stepped(1, 0.014)
        pace.stepped(4, 0.026)
    pace.stepped(3, 0.070, left=True)  # filtering the batch's caches down to three rows
    pace.stepped(2, 0.060, left=True)
    assert set(pace.step_s) == {1, 4}  # widths 2 and 3 were only ever seen right after a row left
    # Their excess over a plain step interpolated between widths 1 and 4: 0.048 and 0.042.
    assert pace.leave_s == pytest.approx(0.045) and pace.join_s is None
