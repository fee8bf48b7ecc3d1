"""Properties of the capacity table and the plan verdict, over random geometries, budgets and KV schemes."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gmlx_plan.capacity import CapacityTable, build_table, fits, max_width_at, plan, table_widths
from gmlx_plan.geometry import Geometry, LayerKV
from gmlx_plan.memory import KVQuant, MemoryModel, footprint, kv_bytes

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GiB = 1 << 30
Case = tuple[MemoryModel, int, int, int | None]  # model, budget, decode width, max_kv_size


@st.composite
def geometries(draw: st.DrawFn) -> Geometry:
    n = draw(st.integers(1, 48))
    kv = draw(st.sampled_from([1, 2, 4, 8]))
    heads = kv * draw(st.sampled_from([1, 2, 4, 8]))
    head_dim = draw(st.sampled_from([32, 64, 80, 96, 128, 256]))
    window = draw(st.none() | st.integers(16, 8192))
    pattern = draw(st.integers(1, 8))
    layers = tuple(LayerKV(kv, head_dim, head_dim, None if window is None or i % pattern == pattern - 1 else window)
                   for i in range(n))
    hidden = heads * head_dim
    return Geometry("prop", heads, hidden, draw(st.integers(hidden, 4 * hidden)), draw(st.integers(256, 300_000)),
                    draw(st.integers(1, 1 << 17)), layers)


kv_quants = st.none() | st.builds(
    KVQuant, scheme=st.sampled_from(["uniform", "kvarn"]), bits=st.sampled_from([2, 3, 4, 5, 6, 8]),
    group_size=st.sampled_from([32, 64, 128]), value_bits=st.none() | st.sampled_from([2, 4, 8]),
    tail_tokens=st.none() | st.integers(0, 4096), quantize_sliding=st.booleans(), keep_last_layer=st.booleans())


@st.composite
def models(draw: st.DrawFn, quant: bool = True) -> Case:
    g = draw(geometries())
    m = MemoryModel(g, draw(st.sampled_from(["packed", "dense"])), draw(st.integers(0, 40 * GiB)),
                    draw(kv_quants) if quant else None, draw(st.integers(1, 2048)), fused_attention=draw(st.booleans()))
    budget = draw(st.integers(0, 80 * GiB))
    return m, budget, draw(st.integers(1, 16)), draw(st.none() | st.integers(1, 1 << 17))


def _table(m: MemoryModel, budget: int, decode_batch: int, max_kv: int | None) -> CapacityTable:
    return build_table(m, budget, model="prop", decode_batch=decode_batch, max_kv_size=max_kv)


@SETTINGS
@given(models())
def test_max_ctx_never_rises_as_width_grows_and_stays_in_the_window(case: Case) -> None:
    m, budget, batch, max_kv = case
    t = _table(m, budget, batch, max_kv)
    ctx = [c for _, c in t.max_ctx]
    assert ctx == sorted(ctx, reverse=True)
    assert all(0 <= c <= t.context_length <= m.geometry.context_length for c in ctx)
    assert t.context_length == min(m.geometry.context_length, max_kv or m.geometry.context_length)
    assert batch in dict(t.max_ctx) and max(dict(t.max_ctx)) >= 4 * batch  # up to and beyond the decode width


@SETTINGS
@given(models(), st.data())
def test_no_ok_plan_exceeds_the_budget_and_max_ctx_is_tight(case: Case, data: st.DataObject) -> None:
    m, budget, batch, max_kv = case
    t = _table(m, budget, batch, max_kv)
    for w, c in t.max_ctx:
        if c:
            assert footprint(m, w, c) <= budget
        if c < t.context_length:
            assert footprint(m, w, c + 1) > budget  # the bisection found the largest depth
    for _ in range(10):
        width = data.draw(st.integers(1, 2 * max(dict(t.max_ctx))))
        depth = data.draw(st.integers(1, t.context_length))
        if plan(t, width, depth).ok:
            assert footprint(m, width, depth) <= budget


@SETTINGS
@given(models(quant=False), kv_quants.filter(lambda q: q is not None), st.integers(1, 1 << 17))
def test_kv_quantization_never_lowers_capacity(case: Case, q: KVQuant,
                                               depth: int) -> None:
    m, budget, batch, max_kv = case
    mq = MemoryModel(m.geometry, m.layout, m.weights_bytes, q, m.prefill_chunk, fused_attention=m.fused_attention)
    assert kv_bytes(mq, depth) <= kv_bytes(m, depth)
    plain, quant = _table(m, budget, batch, max_kv), _table(mq, budget, batch, max_kv)
    assert all(cq >= cp for (_, cp), (_, cq) in zip(plain.max_ctx, quant.max_ctx, strict=True))
    assert all(wq >= wp for (_, wp), (_, wq) in zip(plain.max_width_at_depth, quant.max_width_at_depth, strict=True))


@SETTINGS
@given(models(), st.data())
def test_the_table_read_at_untabulated_widths_is_conservative(case: Case, data: st.DataObject) -> None:
    m, budget, batch, max_kv = case
    t = _table(m, budget, batch, max_kv)
    tabulated = set(table_widths(batch))
    width = data.draw(st.integers(1, max(tabulated)).filter(lambda w: w not in tabulated))
    depth = data.draw(st.integers(1, t.context_length))
    v = plan(t, width, depth)
    if v.ok:
        assert fits(m, budget, width, depth)
        assert v.width_read is not None and v.width_read > width
        assert all(plan(t, w, depth).ok for w in range(1, width))  # narrower fan-outs fit too
    else:
        assert v.reason


@SETTINGS
@given(models())
def test_max_width_at_depth_is_the_exact_largest_width(case: Case) -> None:
    m, budget, batch, max_kv = case
    t = _table(m, budget, batch, max_kv)
    for d, w in t.max_width_at_depth:
        assert w == max_width_at(m, budget, d)
        assert (w == 0 or fits(m, budget, w, d)) and not fits(m, budget, w + 1, d)


def test_plan_reasons() -> None:
    g = Geometry("t", 4, 256, 512, 1000, 4096, (LayerKV(1, 64, 64),) * 2)
    t = build_table(MemoryModel(g, "packed", 1000), 1 << 30, model="t", decode_batch=4)
    assert plan(t, 3, 4096).ok and plan(t, 3, 4096).width_read == 4
    assert "context window" in (plan(t, 1, 4097).reason or "")
    assert "beyond the capacity table" in (plan(t, 17, 10).reason or "")
    assert "at least 1" in (plan(t, 0, 10).reason or "")
    tiny = build_table(MemoryModel(g, "packed", 1000), 3_000_000, model="t", decode_batch=4)
    v = plan(tiny, 16, 4096)
    assert not v.ok and v.width_read == 16 and "16 streams fit at most" in (v.reason or "")
