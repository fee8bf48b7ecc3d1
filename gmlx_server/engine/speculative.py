"""Speculative decoding's acceptance rule (Leviathan et al. 2023; Chen et al. 2023).

A drafter proposes k tokens, drawn from its distributions q_0..q_{k-1}; the target scores them in one
forward pass, giving its distributions p_0..p_k (p_k follows the last draft). Draft i is kept with
probability min(1, p_i(x_i) / q_i(x_i)); the first one rejected is replaced by a draw from the residual
max(0, p_i - q_i), normalized; when all k are kept, one more token is drawn from p_k. Every emitted token
is then distributed exactly as the target's own sampling would draw it, whatever the drafter proposes
(tests/unit/test_speculative.py checks this with a chi-square test). Greedy decoding keeps drafts while
they equal the target's argmax and then takes the argmax: the text is the target's own.

p and q are the final sampling distributions (after penalties, filters and temperature), so filters the
drafter and target share keep their meaning. spec_round.py runs the rounds in the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx


@dataclass(frozen=True)
class Verdict:
    accepted: int  # how many drafted tokens were kept
    tokens: tuple[int, ...]  # the kept drafts, then the replacement or bonus token


def accept_greedy(drafts: Sequence[int], target: Sequence[int]) -> Verdict:
    """target: the target's argmax at each of the k + 1 positions."""
    n = 0
    while n < len(drafts) and drafts[n] == target[n]:
        n += 1
    return Verdict(n, (*drafts[:n], int(target[n])))


def accept_sampled(drafts: Sequence[int], p: mx.array, q: mx.array, key: mx.array) -> Verdict:
    """p: (k + 1, V) target probabilities; q: (k, V) the drafter's, from which `drafts` were drawn."""
    k = len(drafts)
    keep_key, draw_key = mx.random.split(key)
    idx = mx.array(list(drafts), dtype=mx.int32)[:, None]
    ratio = mx.take_along_axis(p[:k], idx, axis=-1)[:, 0] / mx.take_along_axis(q, idx, axis=-1)[:, 0]
    kept: list[bool] = (mx.random.uniform(shape=(k,), key=keep_key) < ratio).tolist()  # type: ignore[assignment]
    n = next((i for i, ok in enumerate(kept) if not ok), k)
    if n == k:
        last = p[k]
    else:
        residual = mx.maximum(p[n] - q[n], 0.0)
        total = residual.sum()
        # p == q at this position leaves no residual (a rejection then has probability 0): fall back to p.
        last = mx.where(total > 0, residual / mx.maximum(total, 1e-30), p[n])
    token = mx.random.categorical(mx.log(last), key=draw_key)
    return Verdict(n, (*drafts[:n], int(token.item())))  # type: ignore[arg-type]
