"""Per-request sampling on top of mlx-vlm's filters and logits processors.

mlx-vlm's `make_sampler` draws from the global random state (and its seed is lost once
min_p is set), so each request here owns a PRNG key and splits it per token: a seed
reproduces a request whatever else the engine is running.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from mlx_vlm import sample_utils as su

from gmlx_server.engine.kernels import probe
from gmlx_server.engine.kernels.fast_ops import Primitives
from gmlx_server.engine.types import SamplingParams

Filter = Callable[[mx.array], mx.array]
Processor = Callable[[mx.array, mx.array], mx.array]


def _filters(p: SamplingParams, special_ids: Collection[int]) -> list[Filter]:
    """The same chain, in the same order, as mlx_vlm.sample_utils.make_sampler."""
    temp = su.clamp_temperature(p.temperature)
    out: list[Filter] = []
    if p.top_n_sigma > 0.0:
        out.append(lambda x: su.apply_top_n_sigma(x, p.top_n_sigma))
    if p.p_less:
        out.append(lambda x: su.apply_p_less(x, temp))
    if 0.0 < p.typical_p < 1.0:
        out.append(lambda x: su.apply_typical_p(x, p.typical_p))
    if 0.0 < p.top_p < 1.0:
        out.append(lambda x: top_p_filter(x, p.top_p))
    if p.min_p > 0.0:
        out.append(lambda x: su.apply_min_p(x, p.min_p, 1))
    if p.xtc_probability > 0.0:  # XTC alone reads the special ids: sorted here, not for every request
        xtc_ids = sorted(special_ids)
        out.append(lambda x: su.apply_xtc(x, p.xtc_probability, p.xtc_threshold, xtc_ids))
    if p.top_k > 0:  # a k at or above the vocabulary keeps every token: no filter (and no out-of-range kth)
        out.append(lambda x: top_k_filter(x, p.top_k) if p.top_k < x.shape[-1] else x)
    return out


NUCLEUS_CANDIDATES = (1024, 32768)  # the most probable tokens top_p looks among; a wider nucleus sorts them all


def top_p_filter(logprobs: mx.array, top_p: float) -> mx.array:
    """mlx-vlm's apply_top_p (tokens below the nucleus's least probable one masked to -inf), found from the
    most probable tokens when the nucleus lies within them: MLX's CPU sort of the whole vocabulary took 26 ms
    a row and step over Gemma 3's 262K tokens, a numpy partition takes 0.3 ms."""
    cuts = [_nucleus_cut(row, top_p) for row in _rows(logprobs)]
    if any(c is None for c in cuts):
        return su.apply_top_p(logprobs, top_p)
    return _below_masked(logprobs, np.array(cuts, dtype=np.float32))


def _nucleus_cut(row: np.ndarray, top_p: float) -> float | None:
    """The least probable kept token's log-probability, as apply_top_p's exclusive scan from the top finds
    it (summed in float64: its float32 scan drifts by ~1e-4 over a wide nucleus's tail); None when the nucleus
    may reach past every candidate set."""
    bound = top_p * float(np.exp(row).sum(dtype=np.float64))
    for size in NUCLEUS_CANDIDATES:
        k = min(size, row.size)
        top = np.sort(np.partition(row, row.size - k)[row.size - k:])[::-1]
        probs = np.exp(top.astype(np.float64))
        kept = int(np.count_nonzero(np.cumsum(probs) - probs < bound))  # exclusive mass above each token
        if kept < k or k == row.size:
            return float(top[kept - 1])
    return None


def top_k_filter(logprobs: mx.array, top_k: int) -> mx.array:
    """mlx-vlm's apply_top_k from the k-th largest value (a numpy partition, 3x MLX's CPU argpartition at 262K
    tokens); a tie at that value keeps its copies, where apply_top_k keeps an arbitrary k of them."""
    rows = _rows(logprobs)
    return _below_masked(logprobs, np.partition(rows, rows.shape[-1] - top_k, axis=-1)[:, rows.shape[-1] - top_k])


def _rows(logprobs: mx.array) -> np.ndarray:
    """(..., V) -> (rows, V) float32 in numpy (evaluates the logits)."""
    return np.asarray(logprobs.astype(mx.float32)).reshape(-1, logprobs.shape[-1])


def _below_masked(logprobs: mx.array, thresholds: np.ndarray) -> mx.array:
    """-inf wherever a row's log-probability is below its threshold, as mlx-vlm's filters mask."""
    threshold = mx.array(thresholds.reshape(*logprobs.shape[:-1], 1))
    return mx.where(logprobs < threshold, mx.array(-mx.inf, dtype=logprobs.dtype), logprobs)


def _host_filters(p: SamplingParams) -> bool:
    """The chain is top_p and/or top_k alone (every chat intent's): a draw can be made on the host."""
    others = (p.top_n_sigma > 0.0 or p.p_less or 0.0 < p.typical_p < 1.0 or p.min_p > 0.0
              or p.xtc_probability > 0.0)
    return not others and (0.0 < p.top_p < 1.0 or p.top_k > 0)


def _processors(p: SamplingParams) -> list[Processor]:
    procs: list[Processor] = su.make_logits_processors(
        logit_bias=dict(p.logit_bias) or None,
        repetition_penalty=p.repetition_penalty if p.repetition_penalty != 1.0 else None,
        repetition_context_size=p.repetition_context_size,
        presence_penalty=p.presence_penalty or None,
        presence_context_size=p.presence_context_size,
        frequency_penalty=p.frequency_penalty or None,
        frequency_context_size=p.frequency_context_size,
    )
    return procs


RANDOM_SEED = -1  # llama.cpp's spelling of "no seed": a fresh random one


def seed_value(seed: int | None) -> int:
    """The PRNG seed: random for None or -1; any other integer taken modulo 2**64 (MLX keys are unsigned)."""
    if seed is None or seed == RANDOM_SEED:
        return int.from_bytes(os.urandom(8), "little")
    return seed % (1 << 64)


@dataclass
class Draw:
    token: mx.array  # shape (1,), int
    logprobs: mx.array  # shape (1, V): the model's log-softmax after processors, before filters


class KeyChain:
    """A request's PRNG key, split once per token as mx.random.split splits it; held as two uint32 on the host
    when the kernels extension (which splits it there, to the bit) is built, so a host draw runs no MLX op."""

    def __init__(self, seed: int) -> None:
        self.ext = probe().ext
        self._pair = (seed >> 32, seed & 0xFFFFFFFF)  # mx.random.key's two words
        self._key = mx.random.key(seed) if self.ext is None else None

    def next_pair(self) -> tuple[int, int]:
        """The next subkey's words (the extension is built)."""
        assert self.ext is not None
        k0, k1, s0, s1 = self.ext.split_key(*self._pair)
        self._pair = (k0, k1)
        return s0, s1

    def next(self) -> mx.array:
        if self._key is None:
            return mx.array(self.next_pair(), dtype=mx.uint32)
        self._key, sub = mx.random.split(self._key)
        return sub


class RequestSampler:
    def __init__(self, params: SamplingParams, special_ids: Collection[int]) -> None:
        self.params = params
        self._filters = _filters(params, special_ids) if not params.greedy else []
        self._procs = _processors(params)
        self._history_procs = len(self._procs) - bool(params.logit_bias)  # penalties read the history, a bias does not
        self._keys = KeyChain(seed_value(params.seed))
        self._temp = su.clamp_temperature(params.temperature)
        self._host = self._keys.ext is not None and _host_filters(params)
        self._argmax = Primitives(self._keys.ext).argmax  # MLX's indices, in one vector op where the kernels are built

    @property
    def needs_history(self) -> bool:
        return self._history_procs > 0

    @property
    def reads_logprobs(self) -> bool:
        """A draw that reads this row's log-softmax (filters; no processor): the batch computes them together."""
        return self.plain and bool(self._filters)

    @property
    def plain(self) -> bool:
        """No logits processor (penalties, bias, grammar): the final distribution is the logits' own, filtered."""
        return not self._procs

    def distribution(self, logits: mx.array) -> mx.array:
        """(n, V) logits -> the probabilities a draw from them samples (filters and temperature; plain only)."""
        logits = logits.astype(mx.float32)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # the filters read log-probabilities
        for f in self._filters:
            logprobs = f(logprobs)
        return mx.softmax(logprobs * (1.0 / self._temp), axis=-1)

    def next_key(self) -> mx.array:
        return self._keys.next()

    def constrain(self, processor: Processor) -> None:
        """Run `processor` after every other one (a grammar mask must see the final logits).

        It does not make the sampler keep a history: the engine advances a grammar with consume()."""
        self._procs.append(processor)

    def __call__(self, logits: mx.array, history: mx.array | None, logprobs: mx.array | None = None) -> Draw:
        """logits: (1, V) float; history: 1-D token ids for penalties (prompt + generated); logprobs: the batch's
        log-softmax of these logits (equal to the bit to this row's own), taken when no processor changes them."""
        logits = logits.astype(mx.float32)
        for proc in self._procs:
            logits = proc(history if history is not None else mx.array([], mx.int32), logits)
        if logprobs is None or self._procs:
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # lazy: computed only when read
        if self.params.greedy:  # the logits' argmax: the log-softmax (a pass of exp over the vocabulary) is not needed
            return Draw(self._argmax(logits), logprobs)
        if self._host:
            host = self._host_draw(logprobs)
            if host is not None:
                return Draw(mx.array([host], dtype=mx.uint32), logprobs)
        filtered = logprobs if self._filters else logits  # categorical normalizes: unfiltered logits serve as they are
        for f in self._filters:
            filtered = f(filtered)
        token = mx.random.categorical(filtered * (1.0 / self._temp), key=self.next_key())
        return Draw(token, logprobs)

    def _host_draw(self, logprobs: mx.array) -> int | None:
        """The token categorical(filtered / temperature) draws, computed from the tokens top_p and top_k keep
        (ext.categorical_at: MLX's inverse CDF over them alone, the same subkey's uniform), so a seeded draw
        is mlx-vlm's chain's own to the bit. None, drawing nothing, when the nucleus is too wide for it."""
        p, row = self.params, _rows(logprobs)[0]
        kept: np.ndarray = np.arange(row.size)
        if 0.0 < p.top_p < 1.0:
            cut = _nucleus_cut(row, p.top_p)
            if cut is None:
                return None
            kept = np.flatnonzero(row >= cut)
        if 0 < p.top_k < kept.size:  # top_k after top_p: the k-th largest of what the nucleus kept
            kept = kept[row[kept] >= np.partition(row[kept], kept.size - p.top_k)[kept.size - p.top_k]]
        scaled = row[kept] * np.float32(1.0 / self._temp)  # as MLX multiplies: float32 by the rounded scale
        if kept.size > NUCLEUS_CANDIDATES[-1] or not np.isfinite(scaled).all():
            return None  # MLX's passes over the vocabulary are as cheap by then; an infinite logit is theirs
        assert self._keys.ext is not None
        return int(self._keys.ext.categorical_at(*self._keys.next_pair(), row.size, kept, scaled))


def top_alternatives(logprobs: mx.array, n: int) -> mx.array:
    """Indices of the n most likely tokens, most likely first (lazy; caller evaluates)."""
    part = mx.argpartition(-logprobs, kth=n - 1, axis=-1)[..., :n]
    order = mx.argsort(-mx.take_along_axis(logprobs, part, axis=-1), axis=-1)
    return mx.take_along_axis(part, order, axis=-1)
