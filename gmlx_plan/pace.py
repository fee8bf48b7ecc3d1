"""Measured paces: the one model of time that the server's estimates, its Retry-After and gmlx plan's
simulator all compute with.

  prefill   the cold tokens [start, end) of a prompt take  c * chunks + a * (end - start) + b * (sum of their
            depths)  s: c a forward pass's fixed cost (one read of the weights, the first token's draw), paid per
            chunk of at most PREFILL_CHUNK tokens; a the seconds a token costs at depth 0; b what each token of
            context before it adds (attention). Fitted from spans of computed tokens only: a span restored from
            the prompt cache is no prefill. A chunk of fewer than FEW_ROWS tokens (a warm prompt's cold tail)
            has its own c and a, fitted on such chunks: its matmuls run per-row kernels, not sgemm
  restore   warm tokens come back from the prompt cache at restore_tok_s (a copy, no model run)
  decode    a batched step's seconds by width: linear between the measured widths (the nearest outside them), at
            the context it was measured at (step_ctx: the batch's KV tokens, all rows together), plus
            step_s_per_ctx for each KV token more (attention reads them all); the step right after a row joins
            the batch takes join_s more (the engine merges the row's cache into the batch's), and the step
            after a row left takes leave_s more (the batch's caches are filtered down to the rows kept)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gmlx_plan.memory import PREFILL_CHUNK
from gmlx_plan.queueing import Rates, step_time

# A chunk of fewer tokens multiplies through the kernels' per-row tiles (gmlx_server/engine/kernels/src/dispatch.cpp,
# kSgemmRows), about 1.7x the seconds a token of a longer chunk takes (sgemm, or with VNNI the int16 GEMM from the
# same bound), with a smaller fixed cost
FEW_ROWS = 48  # the kernels' kSgemmRows (src/dispatch.cpp; tests/unit/test_kernel_sources.py holds them equal)
CACHE_BLOCK = 64  # the prompt cache's block: a partial reuse shares at least one (gmlx_server's prompt_cache)
Span = tuple[int, int, float]  # computed prompt tokens [start, end) and the seconds they took


def reusable(shared: int, prompt: int) -> int:
    """The warm tokens of a prompt whose first `shared` tokens another prompt already in the cache holds: at least
    one cache block is reused, and one prompt token is always prefilled (the server's prompt cache)."""
    n = min(shared, prompt - 1)
    return n if n >= CACHE_BLOCK else 0


@dataclass(frozen=True)
class PrefillPace:
    s_per_token: float  # a: a token's cost at depth 0
    s_per_token_depth: float = 0.0  # b: added per token of context before it
    s_per_chunk: float = 0.0  # c: a forward pass's fixed cost, once per chunk
    few: tuple[float, float] | None = None  # (c, a) of a chunk under FEW_ROWS tokens; None: as a longer one's

    def chunk_s(self, start: int, end: int) -> float:
        """One forward pass over the tokens [start, end)."""
        k = end - start
        c, a = self.few if self.few is not None and k < FEW_ROWS else (self.s_per_chunk, self.s_per_token)
        return c + k * (a + self.s_per_token_depth * (start + end - 1) / 2)

    def seconds(self, start: int, end: int) -> float:
        """Tokens [start, end) in chunks of PREFILL_CHUNK from `start`, as the engine runs them."""
        return sum(self.chunk_s(s, min(s + PREFILL_CHUNK, end)) for s in range(start, end, PREFILL_CHUNK))

    @property
    def tok_s(self) -> float:
        """Tokens a second at depth 0 within a chunk (the chunk's fixed cost aside)."""
        return 1.0 / self.s_per_token


SLOPE_SPANS, SLOPE_SPREAD = 4, 256.0  # a depth slope is read only from this many spans this far apart (sd)
SIZE_SPREAD = 64.0  # a chunk's fixed cost is read only from spans whose sizes spread this far (sd, tokens)
FEW_SPREAD = 4.0  # likewise a short chunk's, among chunks under FEW_ROWS (a hit's one token beside 16-token tails)


def _solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when the system is singular."""
    n = len(v)
    a = [[*row, y] for row, y in zip(m, v, strict=True)]
    for i in range(n):
        p = max(range(i, n), key=lambda r: abs(a[r][i]))
        if abs(a[p][i]) < 1e-300:
            return None
        a[i], a[p] = a[p], a[i]
        for r in range(i + 1, n):
            f = a[r][i] / a[i][i]
            a[r] = [x - f * y for x, y in zip(a[r], a[i], strict=True)]
    out = [0.0] * n
    for i in reversed(range(n)):
        out[i] = (a[i][n] - sum(a[i][j] * out[j] for j in range(i + 1, n))) / a[i][i]
    return out


def _spread(values: list[float], weights: list[float]) -> float:
    """The weighted variance of `values`."""
    total = sum(weights)
    mean = sum(w * x for w, x in zip(weights, values, strict=True)) / total
    return sum(w * (x - mean) ** 2 for w, x in zip(weights, values, strict=True)) / total


def _fit(obs: list[tuple[int, float, float]], depth: bool, chunk: bool) -> PrefillPace | None:
    """Least squares of each span's seconds on c + k * (a + b * depth), weighted by 1/k (a span's noise grows
    with its tokens); the columns left out are 0. None when the fit is singular or a term comes out < 0."""
    rows = [([float(k), *([k * d] if depth else []), *([1.0] if chunk else [])], k, sec) for k, d, sec in obs]
    cols = range(len(rows[0][0]))
    m = [[sum(x[i] * x[j] / k for x, k, _ in rows) for j in cols] for i in cols]
    v = [sum(x[i] * sec / k for x, k, sec in rows) for i in cols]
    beta = _solve(m, v)
    if beta is None or beta[0] <= 0 or min(beta) < 0:
        return None
    a, rest = beta[0], beta[1:]
    b = rest.pop(0) if depth else 0.0
    return PrefillPace(a, b, rest.pop(0) if chunk else 0.0)


def fit_prefill(spans: Iterable[Span]) -> PrefillPace | None:
    """The pace of the computed spans: c, a and b fitted on them all; and, once chunks under FEW_ROWS tokens
    come in sizes that spread, their own c and a (at that b). Longer chunks alone would leave c to the depth
    they sit at (a cold prompt's chunks beside a warm one's long tail differ in both)."""
    obs = [(e - s, (s + e - 1) / 2, sec) for s, e, sec in spans if e > s and sec > 0]
    pace = _fit_spans(obs)
    if pace is None:
        return None
    return replace(pace, few=_fit_few([o for o in obs if o[0] < FEW_ROWS], pace.s_per_token_depth))


def _fit_few(obs: list[tuple[int, float, float]], b: float) -> tuple[float, float] | None:
    """(c, a) of the short chunks, their depth's share (b) taken out: least squares weighted by 1/k; None
    when their sizes spread less than FEW_SPREAD or a term comes out < 0."""
    if len(obs) < 2 or _spread([float(k) for k, _, _ in obs], [1.0] * len(obs)) < FEW_SPREAD**2:
        return None
    fit = _fit([(k, d, sec - b * k * d) for k, d, sec in obs], depth=False, chunk=True)
    return None if fit is None else (fit.s_per_chunk, fit.s_per_token)


def _fit_spans(obs: list[tuple[int, float, float]]) -> PrefillPace | None:
    """A flat pace (total seconds over total tokens) unless the spans show more. A depth slope needs
    SLOPE_SPANS spans whose depths spread (spans of much the same depth would pass a short last chunk's
    overhead off as a slope); a chunk cost needs spans of spread sizes. A term that comes out < 0 is dropped."""
    n = sum(k for k, _, _ in obs)
    if not n:
        return None
    flat = PrefillPace(sum(sec for _, _, sec in obs) / n)
    if len(obs) < SLOPE_SPANS:
        return flat
    depth = _spread([d for _, d, _ in obs], [float(k) for k, _, _ in obs]) > SLOPE_SPREAD**2
    chunk = _spread([float(k) for k, _, _ in obs], [1.0] * len(obs)) > SIZE_SPREAD**2
    for d, c in ((depth, chunk), (False, chunk), (depth, False)):
        if (d or c) and (fit := _fit(obs, d, c)) is not None:
            return fit
    return flat


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
    leave_s: float = 0.0  # added to the decode step after a row left the batch

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
        return {"source": self.source, "prefill_tok_s": round(self.prefill.tok_s, 3), **prefill_json(self.prefill),
                "restore_tok_s": self.restore_tok_s, "decode_join_s": self.join_s,
                "decode_step_s": {str(w): s for w, s in sorted(self.step_s.items())},
                "decode_step_ctx": {str(w): c for w, c in sorted(self.step_ctx.items())},
                "decode_step_s_per_ctx": self.step_s_per_ctx, "decode_leave_s": self.leave_s}


def prefill_json(p: PrefillPace | None) -> dict[str, float | None]:
    """A prefill pace's fields as the Paces JSON (and /v1/metrics) names them; null when not measured."""
    few = p.few if p is not None else None
    return {"prefill_s_per_token": p.s_per_token if p else None,
            "prefill_s_per_token_per_depth": p.s_per_token_depth if p else None,
            "prefill_s_per_chunk": p.s_per_chunk if p else None,
            "prefill_few_s_per_chunk": few[0] if few else None, "prefill_few_s_per_token": few[1] if few else None}


def prefill_from_json(raw: Mapping[str, Any]) -> PrefillPace | None:
    """The inverse of prefill_json; None without a per-token cost."""
    a = raw.get("prefill_s_per_token")
    if not a:
        return None
    few_a = raw.get("prefill_few_s_per_token")
    return PrefillPace(float(a), float(raw.get("prefill_s_per_token_per_depth") or 0.0),
                       float(raw.get("prefill_s_per_chunk") or 0.0),
                       (float(raw.get("prefill_few_s_per_chunk") or 0.0), float(few_a)) if few_a else None)


MAX_WIDTH = 256  # widths a rate-given step table covers


def paces_from_rates(rates: Rates, widths: int = MAX_WIDTH) -> Paces:
    """Flags' flat rates as paces: no depth term, nothing restored, steps from the batch-scaling formula."""
    return Paces(PrefillPace(1.0 / rates.prefill_tok_s), {w: rates.step_s(w) for w in range(1, widths + 1)},
                 source="rates")


def paces_from_json(raw: Mapping[str, Any], source: str) -> Paces | None:
    """The inverse of Paces.as_json (a server's /v1/metrics rates.by_model entry, or a bench table's); None when
    it lacks a prefill pace or a decode step."""
    prefill = prefill_from_json(raw)
    steps = {int(w): float(s) for w, s in (raw.get("decode_step_s") or {}).items()}
    if prefill is None or not steps:
        return None
    restore = raw.get("restore_tok_s")
    return Paces(prefill, steps,
                 float(restore) if restore else None, float(raw.get("decode_join_s") or 0.0), source,
                 {int(w): float(c) for w, c in (raw.get("decode_step_ctx") or {}).items()},
                 float(raw.get("decode_step_s_per_ctx") or 0.0), float(raw.get("decode_leave_s") or 0.0))


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
