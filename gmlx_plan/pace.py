"""Measured paces: the one model of time that the server's estimates, its Retry-After and gmlx plan's
simulator all compute with.

  prefill   the cold tokens [start, end) of a prompt take  a * (end - start) + b * (sum of their depths)  s:
            a the seconds a token costs at depth 0, b what each token of context before it adds (attention).
            Fitted from spans of computed tokens only: a span restored from the prompt cache is no prefill
  restore   warm tokens come back from the prompt cache at restore_tok_s (a copy, no model run)
  decode    a batched step's seconds by width: the nearest measured width (ties: the wider), at the context it
            was measured at (step_ctx: the batch's KV tokens, all rows together), plus step_s_per_ctx for each
            KV token more (attention reads them all); the step right after a row joins the batch takes join_s
            more (the engine merges the row's cache into the batch's)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gmlx_plan.queueing import Rates, step_time

CACHE_BLOCK = 64  # the prompt cache's block: a partial reuse shares at least one (gmlx_server's prompt_cache)
Span = tuple[int, int, float]  # computed prompt tokens [start, end) and the seconds they took


@dataclass(frozen=True)
class PrefillPace:
    s_per_token: float  # a: a token's cost at depth 0
    s_per_token_depth: float = 0.0  # b: added per token of context before it

    def seconds(self, start: int, end: int) -> float:
        n = max(0, end - start)
        return n * (self.s_per_token + self.s_per_token_depth * (start + end - 1) / 2) if n else 0.0

    def tok_s(self, start: int = 0, end: int = 1) -> float:
        """Tokens a second over [start, end): the rate a prompt's cold part runs at."""
        s = self.seconds(start, end)
        return (end - start) / s if s > 0 else 0.0


SLOPE_SPANS, SLOPE_SPREAD = 4, 256.0  # a depth slope is read only from this many spans this far apart (sd)


def fit_prefill(spans: Iterable[Span]) -> PrefillPace | None:
    """Least squares of each span's seconds per token on its mean depth, weighted by its tokens; a flat pace
    (b = 0, total seconds over total tokens) from too few spans, spans of much the same depth (a prompt's
    short last chunk would pass its own overhead off as a slope), or a slope that comes out < 0."""
    obs = [(e - s, (s + e - 1) / 2, sec) for s, e, sec in spans if e > s and sec > 0]
    n = sum(k for k, _, _ in obs)
    if not n:
        return None
    total = sum(sec for _, _, sec in obs)
    mean_d = sum(k * d for k, d, _ in obs) / n
    mean_y = total / n
    var = sum(k * (d - mean_d) ** 2 for k, d, _ in obs)
    if len(obs) < SLOPE_SPANS or var <= SLOPE_SPREAD**2 * n:
        return PrefillPace(mean_y)
    b = sum(k * (d - mean_d) * (sec / k - mean_y) for k, d, sec in obs) / var
    a = mean_y - b * mean_d
    return PrefillPace(a, b) if b >= 0 and a > 0 else PrefillPace(mean_y)


@dataclass(frozen=True)
class Paces:
    """What time a request's parts take: its warm tokens, its cold tokens at their depth, a decode step."""

    prefill: PrefillPace
    step_s: Mapping[int, float]  # decode step seconds by batch width (measured widths)
    restore_tok_s: float | None = None  # None: nothing restored yet, restores count as free
    join_s: float = 0.0  # added to the decode step after a row joins the batch
    source: str = "given"  # where the paces come from (a server's metrics, flags, a bench table)
    step_ctx: Mapping[int, float] = field(default_factory=dict)  # the batch's KV tokens the steps were timed at
    step_s_per_ctx: float = 0.0  # a step's added seconds per KV token of the batch beyond that

    def __post_init__(self) -> None:
        if not self.step_s:
            raise ValueError("paces need a decode step time for at least one width")

    def step(self, width: int, ctx: float | None = None) -> float:
        """A step's seconds at `width`; with `ctx` (the batch's KV tokens), moved along the depth slope."""
        w = max(1, width)
        exact = self.step_s.get(w)
        base = exact if exact is not None else step_time(self.step_s)(w)
        if ctx is None or not self.step_s_per_ctx or not self.step_ctx:
            return base
        at = self.step_ctx.get(w, step_time(self.step_ctx)(w))
        return max(0.25 * base, base + self.step_s_per_ctx * (ctx - at))

    def restore_s(self, warm: int) -> float:
        return warm / self.restore_tok_s if warm > 0 and self.restore_tok_s else 0.0

    def prompt_s(self, prompt: int, warm: int = 0) -> float:
        """A prompt alone: its warm tokens restored, its cold ones prefilled at their depth."""
        warm = max(0, min(warm, prompt))
        return self.restore_s(warm) + self.prefill.seconds(warm, prompt)

    def as_json(self) -> dict[str, Any]:
        p = self.prefill
        return {"source": self.source, "prefill_tok_s": round(p.tok_s(), 3),
                "prefill_s_per_token": p.s_per_token, "prefill_s_per_token_per_depth": p.s_per_token_depth,
                "restore_tok_s": self.restore_tok_s, "decode_join_s": self.join_s,
                "decode_step_s": {str(w): s for w, s in sorted(self.step_s.items())},
                "decode_step_ctx": {str(w): c for w, c in sorted(self.step_ctx.items())},
                "decode_step_s_per_ctx": self.step_s_per_ctx}


MAX_WIDTH = 256  # widths a rate-given step table covers


def paces_from_rates(rates: Rates, widths: int = MAX_WIDTH) -> Paces:
    """Flags' flat rates as paces: no depth term, nothing restored, steps from the batch-scaling formula."""
    return Paces(PrefillPace(1.0 / rates.prefill_tok_s), {w: rates.step_s(w) for w in range(1, widths + 1)},
                 source="rates")


def paces_from_json(raw: Mapping[str, Any], source: str) -> Paces | None:
    """The inverse of Paces.as_json (a server's /v1/metrics rates.by_model entry, or a bench table's); None when
    it lacks a prefill pace or a decode step."""
    a = raw.get("prefill_s_per_token")
    steps = {int(w): float(s) for w, s in (raw.get("decode_step_s") or {}).items()}
    if not a or not steps:
        return None
    restore = raw.get("restore_tok_s")
    return Paces(PrefillPace(float(a), float(raw.get("prefill_s_per_token_per_depth") or 0.0)), steps,
                 float(restore) if restore else None, float(raw.get("decode_join_s") or 0.0), source,
                 {int(w): float(c) for w, c in (raw.get("decode_step_ctx") or {}).items()},
                 float(raw.get("decode_step_s_per_ctx") or 0.0))


def fit_step_depth(steps: Mapping[int, Sequence[tuple[float, int]]]) -> float:
    """Seconds a decode step adds per KV token of its batch: the slope of (context, seconds) pooled within
    each width; 0 when the contexts spread less than SLOPE_SPREAD tokens (sd) or the slope comes out < 0."""
    dx2 = dxy = 0.0
    n = 0
    for samples in steps.values():
        if len(samples) < 2:
            continue
        mx = sum(c for _, c in samples) / len(samples)
        my = sum(s for s, _ in samples) / len(samples)
        dx2 += sum((c - mx) ** 2 for _, c in samples)
        dxy += sum((c - mx) * (s - my) for s, c in samples)
        n += len(samples)
    if n < SLOPE_SPANS or dx2 <= SLOPE_SPREAD**2 * n:
        return 0.0
    return max(0.0, dxy / dx2)
