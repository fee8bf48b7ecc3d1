"""The capacity table: how deep W streams can go in a memory budget, and the plan verdict read from it.

A plan of W streams at D tokens fits when footprint(W, D) <= budget (gmlx_plan.memory):
weights + W * KV(D) + the larger transient of a prefill chunk or a W-row decode step at depth D.
footprint never falls as W or D grow, so each search below is a bisection.

  max_ctx[W]              the largest D <= context limit that fits at width W, for W in
                          table_widths(decode_batch): 1, 2, 4, ... up to the first power of two at or
                          past max(16, 4x the decode width), plus the decode width itself; 0 when not
                          even one token fits
  max_width_at_depth[D]   the largest W that fits at depth D, for D in 1024, 2048, ... up to the
                          context limit, plus the limit itself (exact, not limited to tabulated widths)
  plan(table, W, D)       ok when D <= max_ctx at the smallest tabulated width >= W (conservative:
                          that width fits D, so every narrower width does too)

JSON (table_to_json): the `capacity` section of GET /v1/metrics and `gmlx plan --json`'s "capacity":

  {"model": str, "architecture": str,
   "layout": "packed" | "dense",           weights layout the model runs in
   "kv_dtype_bytes": 2 | 4,                unquantized KV element size (kv_dtype: float16 2, float32 4)
   "kv_quant": null | {"scheme", "bits", "group_size", ("value_bits", "tail_tokens": kvarn only),
                       "layers_quantized", "layers_fp16", "verdict": "full" | "partial" | "dropped",
                       "verdict_batched": the same words for rows decoding in a batch},
   "draft": null | {"model", "draft_tokens",   a speculative model's drafter and the k it drafts per round;
                    "weights_bytes",           its weights (weights_bytes below counts both models)
                    "kv_bytes_per_token"},     its KV (kv_bytes_per_token below counts both models)
   "context_length": int,                  trained window, lowered by max_kv_size
   "decode_batch": int, "prefill_chunk": int,
   "budget_bytes": int, "weights_bytes": int,
   "kv_bytes_per_token": int,              one stream, every layer (sliding ones below their window)
   "kv_bytes_per_token_beyond_window": int,  full-attention layers only: the rate once windows are full
   "prefill_transient_bytes": int,         one full chunk at depth max_ctx["1"] (the deepest a stream goes)
   "max_ctx": {"1": int, "2": int, ...},   keys are widths, as strings
   "max_width_at_depth": {"1024": int, ...}}
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from gmlx_plan.memory import MemoryModel, footprint, kv_bytes_per_token, transient_bytes

MIN_TABLE_WIDTH = 16
FIRST_DEPTH = 1024


@dataclass(frozen=True)
class KVQuantReport:
    scheme: str
    bits: int
    group_size: int
    value_bits: int | None
    tail_tokens: int | None
    layers_quantized: int
    layers_fp16: int
    batched_fp16: bool = False  # batched rows run unquantized KV (the engine's report; the planner never sets it)

    @property
    def verdict(self) -> str:
        return "dropped" if not self.layers_quantized else "partial" if self.layers_fp16 else "full"

    @property
    def verdict_batched(self) -> str:
        return "dropped" if self.batched_fp16 else self.verdict


@dataclass(frozen=True)
class DraftReport:
    model: str
    draft_tokens: int
    weights_bytes: int
    kv_bytes_per_token: int


@dataclass(frozen=True)
class CapacityTable:
    model: str
    architecture: str
    layout: str
    kv_dtype_bytes: int
    kv_quant: KVQuantReport | None
    context_length: int
    decode_batch: int
    prefill_chunk: int
    budget_bytes: int
    weights_bytes: int
    kv_bytes_per_token: int
    kv_bytes_per_token_beyond_window: int
    prefill_transient_bytes: int
    max_ctx: tuple[tuple[int, int], ...]  # (width, tokens), widths ascending
    max_width_at_depth: tuple[tuple[int, int], ...]  # (depth, width), depths ascending
    draft: DraftReport | None = None

    def max_ctx_at(self, width: int) -> int | None:
        return dict(self.max_ctx).get(width)


@dataclass(frozen=True)
class PlanVerdict:
    ok: bool
    reason: str | None  # the first condition that fails; None when ok
    width_read: int | None  # the tabulated width the verdict was read at
    max_ctx_read: int | None  # max_ctx at that width


def table_widths(decode_batch: int) -> tuple[int, ...]:
    top = max(MIN_TABLE_WIDTH, 4 * decode_batch)
    widths, w = {max(1, decode_batch), 1}, 1
    while w < top:  # powers of two up to the first one at or past 4x the decode width
        w *= 2
        widths.add(w)
    return tuple(sorted(widths))


def table_depths(context_limit: int) -> tuple[int, ...]:
    depths, d = {context_limit}, FIRST_DEPTH
    while d < context_limit:
        depths.add(d)
        d *= 2
    return tuple(sorted(x for x in depths if x > 0))


def _last_true(pred: Callable[[int], bool], lo: int, hi: int) -> int:
    """The largest x in [lo, hi] with pred(x), pred monotone (true then false); lo - 1 when none."""
    if hi < lo or not pred(lo):
        return lo - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if pred(mid) else (lo, mid - 1)
    return lo


def fits(m: MemoryModel, budget: int, width: int, depth: int) -> bool:
    return footprint(m, width, depth) <= budget


def max_ctx_at_width(m: MemoryModel, budget: int, width: int, context_limit: int) -> int:
    return max(0, _last_true(lambda d: fits(m, budget, width, d), 1, context_limit))


def max_width_at(m: MemoryModel, budget: int, depth: int) -> int:
    hi = 1
    while fits(m, budget, hi * 2, depth) and hi < 1 << 30:
        hi *= 2  # grow until it fails, then bisect
    return max(0, _last_true(lambda w: fits(m, budget, w, depth), 1, hi * 2))


def _kv_report(m: MemoryModel) -> KVQuantReport | None:
    q = m.kv_quant
    if q is None:
        return None
    done = sum(1 for c in m.costs if c.quantized)
    return KVQuantReport(q.scheme, q.bits, q.group_size, q.val_bits if q.scheme == "kvarn" else None,
                         q.tail if q.scheme == "kvarn" else None, done, len(m.costs) - done)


def build_table(m: MemoryModel, budget: int, *, model: str, decode_batch: int,
                max_kv_size: int | None = None) -> CapacityTable:
    """The boot capacity table for `m` in `budget` bytes (the server and `gmlx plan` both call this)."""
    limit = m.geometry.context_length if not max_kv_size else min(m.geometry.context_length, max_kv_size)
    max_ctx = tuple((w, max_ctx_at_width(m, budget, w, limit)) for w in table_widths(decode_batch))
    deepest = max_ctx[0][1]
    return CapacityTable(
        model=model, architecture=m.geometry.architecture, layout=m.layout, kv_dtype_bytes=m.kv_element_bytes,
        kv_quant=_kv_report(m), context_length=limit, decode_batch=decode_batch, prefill_chunk=m.prefill_chunk,
        budget_bytes=budget, weights_bytes=m.weights_bytes, kv_bytes_per_token=kv_bytes_per_token(m),
        kv_bytes_per_token_beyond_window=kv_bytes_per_token(m, beyond_window=True),
        prefill_transient_bytes=transient_bytes(m, min(m.prefill_chunk, max(deepest, 1)), max(deepest, 1)),
        max_ctx=max_ctx, max_width_at_depth=tuple((d, max_width_at(m, budget, d)) for d in table_depths(limit)),
        draft=_draft_report(m),
    )


def _draft_report(m: MemoryModel) -> DraftReport | None:
    d = m.draft
    return None if d is None else DraftReport(d.name, d.tokens, d.model.weights_bytes, kv_bytes_per_token(d.model))


def plan(table: CapacityTable, width: int, depth: int) -> PlanVerdict:
    """GET /v1/capacity/plan's ok: W streams at D tokens each, read at the smallest tabulated width >= W."""
    if width < 1 or depth < 1:
        return PlanVerdict(False, f"width and depth must be at least 1 (got {width}, {depth})", None, None)
    if depth > table.context_length:
        return PlanVerdict(False, f"depth {depth} exceeds the context window of {table.context_length} tokens",
                           None, None)
    read = next(((w, c) for w, c in table.max_ctx if w >= width), None)
    if read is None:
        widest = table.max_ctx[-1][0]
        return PlanVerdict(False, f"width {width} is beyond the capacity table (widest {widest})", None, None)
    w, ctx = read
    if depth > ctx:
        return PlanVerdict(False, f"{w} streams fit at most {ctx} tokens each in the memory budget", w, ctx)
    return PlanVerdict(True, None, w, ctx)


def largest_width_at(table: CapacityTable, depth: int) -> int:
    """The widest tabulated width whose plan at `depth` is ok (what a dispatcher may fan out), 0 if none."""
    return max((w for w, _ in table.max_ctx if plan(table, w, depth).ok), default=0)


def kv_quant_json(q: KVQuantReport | None) -> dict[str, Any] | None:
    """The kv_quant object of the capacity section and of a resident model in /v1/models (value_bits and
    tail_tokens only under kvarn)."""
    if q is None:
        return None
    out: dict[str, Any] = {"scheme": q.scheme, "bits": q.bits, "group_size": q.group_size}
    if q.scheme == "kvarn":
        out |= {"value_bits": q.value_bits, "tail_tokens": q.tail_tokens}
    return out | {"layers_quantized": q.layers_quantized, "layers_fp16": q.layers_fp16, "verdict": q.verdict,
                  "verdict_batched": q.verdict_batched}


def table_to_json(t: CapacityTable) -> dict[str, Any]:
    return {
        "model": t.model, "architecture": t.architecture, "layout": t.layout, "kv_dtype_bytes": t.kv_dtype_bytes,
        "kv_quant": kv_quant_json(t.kv_quant), "draft": asdict(t.draft) if t.draft is not None else None,
        "context_length": t.context_length, "decode_batch": t.decode_batch,
        "prefill_chunk": t.prefill_chunk, "budget_bytes": t.budget_bytes, "weights_bytes": t.weights_bytes,
        "kv_bytes_per_token": t.kv_bytes_per_token,
        "kv_bytes_per_token_beyond_window": t.kv_bytes_per_token_beyond_window,
        "prefill_transient_bytes": t.prefill_transient_bytes,
        "max_ctx": {str(w): c for w, c in t.max_ctx},
        "max_width_at_depth": {str(d): w for d, w in t.max_width_at_depth},
    }
