"""Text, JSON and plots for `gmlx plan` and `gmlx plan simulate` (PNG only when matplotlib imports)."""

from __future__ import annotations

import importlib
import math
import statistics
from collections.abc import Sequence
from typing import Any

from gmlx_plan.budget import format_bytes
from gmlx_plan.capacity import CapacityTable, PlanVerdict
from gmlx_plan.pace import FEW_ROWS
from gmlx_plan.simulate import SimResult

SPARK = " ▁▂▃▄▅▆▇█"


def quantiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50, p90 and max (nearest rank), None without values."""
    if not values:
        return {"p50": None, "p90": None, "max": None}
    s = sorted(values)

    def rank(p: float) -> float:
        return s[min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))]

    return {"p50": rank(0.5), "p90": rank(0.9), "max": s[-1]}


def table_text(t: CapacityTable, verdict: PlanVerdict, width: int, depth: int, widest: int) -> str:
    q = t.kv_quant
    kv = "none" if q is None else (f"{q.scheme} {q.bits}-bit g{q.group_size}"
                                   + (f" values {q.value_bits}-bit tail {q.tail_tokens}" if q.scheme == "kvarn" else "")
                                   + f" ({q.layers_quantized} layers quantized, {q.layers_fp16} not: {q.verdict})")
    head = "ok" if verdict.ok else f"NOT OK: {verdict.reason}"
    lines = [
        f"plan: {width} streams x {depth} tokens -> {head}"
        + (f" (read at width {verdict.width_read})" if verdict.width_read else ""),
        f"largest width at depth {depth}: {widest}",
        f"model {t.model} ({t.architecture}), layout {t.layout}, KV {t.kv_dtype_bytes}-byte elements, KV quant {kv}",
        f"budget {format_bytes(t.budget_bytes)}: weights {format_bytes(t.weights_bytes)}, "
        f"KV {t.kv_bytes_per_token} B/token ({t.kv_bytes_per_token_beyond_window} beyond sliding windows), "
        f"prefill transient {format_bytes(t.prefill_transient_bytes)} (chunk {t.prefill_chunk})",
        f"context window {t.context_length}, decode width {t.decode_batch}",
        *_draft_line(t),
        "",
        f"{'width':>6}  {'max_ctx':>9}",
    ]
    lines += [f"{w:>6}  {c:>9}" + ("  <- decode width" if w == t.decode_batch else "") for w, c in t.max_ctx]
    lines += ["", f"{'depth':>9}  {'max width':>9}"] + [f"{d:>9}  {w:>9}" for d, w in t.max_width_at_depth]
    return "\n".join(lines)


def _draft_line(t: CapacityTable) -> list[str]:
    d = t.draft
    if d is None:
        return []
    return [f"drafter {d.model}: {d.draft_tokens} tokens a round, weights {format_bytes(d.weights_bytes)}, "
            f"KV {d.kv_bytes_per_token} B/token (both counted above)"]


def sim_summary(r: SimResult) -> dict[str, Any]:
    outs = r.outcomes
    ras = [ra for o in outs for ra in o.retry_afters]
    return {
        "requests": len(outs),
        "completed": sum(o.status == "completed" for o in outs),
        "rejected_400": sum(o.status == "rejected_400" for o in outs),
        "gave_up": sum(o.status == "gave_up" for o in outs),
        "admitted": sum(o.accepted is not None for o in outs),
        "rejections_503": len(ras),
        "retry_after_s": {"min": min(ras, default=None), "median": statistics.median(ras) if ras else None,
                          "max": max(ras, default=None)},
        "queue_wait_s": quantiles([w for o in outs if (w := o.queue_wait) is not None]),
        "ttft_s": quantiles([x for o in outs if (x := o.ttft) is not None]),
        "drain_s": r.drain_s,
        "wave_drain_s": list(r.wave_drain_s),
        "slots": r.slots,
        "paces": r.paces.as_json() if r.paces else None,
        "cache_mix": cache_mix(r),
    }


def cache_mix(r: SimResult) -> dict[str, Any]:
    """Which requests the run assumed warm (restoring a shared prefix from the prompt cache) and which cold."""
    started = [o for o in r.outcomes if o.started is not None]
    warm = [o.warm_tokens for o in started if o.warm_tokens]
    return {"cold": len(started) - len(warm), "warm": len(warm), "warm_tokens": max(warm, default=0)}


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def sim_text(s: dict[str, Any]) -> str:
    ra = s["retry_after_s"]
    lines = [
        f"requests {s['requests']}: admitted {s['admitted']}, completed {s['completed']}, "
        f"400 {s['rejected_400']}, gave up {s['gave_up']}; 503s {s['rejections_503']}"
        + (f" (Retry-After {ra['min']}..{ra['max']} s, median {ra['median']})" if s["rejections_503"] else ""),
        f"{'':12}{'p50':>9}{'p90':>9}{'max':>9}",
    ]
    for key, label in (("queue_wait_s", "queue wait"), ("ttft_s", "TTFT")):
        q = s[key]
        lines.append(f"{label:12}{_fmt(q['p50']):>9}{_fmt(q['p90']):>9}{_fmt(q['max']):>9}  s")
    waves = " / ".join(f"{w:.1f}" for w in s["wave_drain_s"])
    lines.append(f"drain {s['drain_s']:.1f} s (per wave {waves} s), decode slots {s['slots']}")
    mix = s["cache_mix"]
    lines.append(f"cache mix assumed: {mix['cold']} cold, {mix['warm']} warm"
                 + (f" ({mix['warm_tokens']} prompt tokens restored each)" if mix["warm"] else ""))
    if s["paces"]:
        lines.append(paces_text(s["paces"]))
    return "\n".join(lines)


def paces_text(p: dict[str, Any]) -> str:
    steps = ", ".join(f"w{w} {float(v) * 1000:.1f}" for w, v in list(p["decode_step_s"].items())[:8])
    more = " ..." if len(p["decode_step_s"]) > 8 else ""
    depth = p["prefill_s_per_token_per_depth"]
    chunk = p.get("prefill_s_per_chunk")
    few_c, few_a = p.get("prefill_few_s_per_chunk") or 0.0, p.get("prefill_few_s_per_token")
    restore = p["restore_tok_s"]
    return (f"paces ({p['source']}): prefill {p['prefill_tok_s']:g} tok/s at depth 0"
            + (f" (+{depth * 1e6:.3f} us a token per token of depth)" if depth else "")
            + (f" +{chunk * 1000:.1f} ms a chunk" if chunk else "")
            + (f" ({few_c * 1000:.1f} ms + {few_a * 1000:.2f} ms a token under {FEW_ROWS} tokens)" if few_a else "")
            + (f", restore {restore:g} tok/s" if restore else ", restores free")
            + f", decode step ms {steps}{more}"
            + (f", +{p['decode_join_s'] * 1000:.1f} after a join" if p.get("decode_join_s") else "")
            + (f", +{p['decode_leave_s'] * 1000:.1f} after a leave" if p.get("decode_leave_s") else ""))


def sparkline(values: Sequence[float], top: float | None = None) -> str:
    hi = top if top is not None else max(values, default=0)
    if not values or hi <= 0:
        return SPARK[0] * len(values)
    return "".join(SPARK[min(len(SPARK) - 1, round(v / hi * (len(SPARK) - 1)))] for v in values)


def _bucketed(r: SimResult, cols: int) -> tuple[list[float], list[float]]:
    """Per time bucket, the largest in-engine and waiting counts; an empty bucket keeps the state before it."""
    end = max(r.drain_s, 1e-9)
    eng, wait = [-1.0] * cols, [-1.0] * cols
    last = [(0.0, 0.0)] * cols  # each bucket's final state
    for t, e, w in r.timeline:
        i = min(cols - 1, int(t / end * cols))
        eng[i], wait[i], last[i] = max(eng[i], e), max(wait[i], w), (e, w)
    for i in range(cols):
        if eng[i] < 0:
            prev = last[i - 1] if i else (0.0, 0.0)
            eng[i], wait[i], last[i] = prev[0], prev[1], prev
    return eng, wait


def histogram(values: Sequence[float], bins: int = 10, bar: int = 40) -> list[str]:
    if not values:
        return ["(no values)"]
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int((v - lo) / span * bins))] += 1
    peak = max(counts)
    return [f"{lo + i * span / bins:8.1f} s |{'#' * round(c / peak * bar):<{bar}}| {c}" for i, c in enumerate(counts)]


def sim_ascii(r: SimResult, cols: int = 60) -> str:
    eng, wait = _bucketed(r, cols)
    ttfts = [x for o in r.outcomes if (x := o.ttft) is not None]
    return "\n".join([
        f"in engine |{sparkline(eng)}| max {max(eng, default=0):.0f}",
        f"waiting   |{sparkline(wait)}| max {max(wait, default=0):.0f}",
        f"           0 s{'':{max(0, cols - 12)}}{r.drain_s:.0f} s",
        "TTFT histogram:",
        *histogram(ttfts),
    ])


def sim_png(r: SimResult, path: str) -> bool:
    """Write a PNG when matplotlib is importable; False otherwise (it is never installed for this)."""
    try:
        matplotlib = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        return False
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 6))
    ts = [t for t, _, _ in r.timeline]
    a.step(ts, [e for _, e, _ in r.timeline], where="post", label="in engine")
    a.step(ts, [w for _, _, w in r.timeline], where="post", label="waiting")
    a.set_xlabel("s")
    a.legend()
    b.hist([x for o in r.outcomes if (x := o.ttft) is not None], bins=20)
    b.set_xlabel("TTFT (s)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
