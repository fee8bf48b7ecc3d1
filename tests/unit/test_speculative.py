"""Speculative acceptance keeps the target's distribution: chi-square tests over many rounds with a drafter
whose distributions differ from the target's, and greedy acceptance keeps exactly the target's argmax."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from gmlx_server.engine.speculative import accept_greedy, accept_sampled

V, K, ROUNDS = 6, 3, 4000
CRITICAL = 20.52  # chi-square, 5 degrees of freedom, p = 0.001


def _chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    return float(((counts - expected) ** 2 / expected).sum())


def test_sampled_tokens_follow_the_target_not_the_drafter() -> None:
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(V), size=K + 1).astype(np.float32)
    q = rng.dirichlet(np.ones(V) * 0.5, size=K).astype(np.float32)  # a drafter that disagrees
    first, second, drafted_first = np.zeros(V), np.zeros(V), np.zeros(V)
    accepted = 0
    for r in range(ROUNDS):
        drafts = [int(rng.choice(V, p=q[i] / q[i].sum())) for i in range(K)]
        v = accept_sampled(drafts, mx.array(p), mx.array(q), mx.random.key(r))
        assert len(v.tokens) == v.accepted + 1 and list(v.tokens[: v.accepted]) == drafts[: v.accepted]
        first[v.tokens[0]] += 1
        drafted_first[drafts[0]] += 1
        if len(v.tokens) > 1:
            second[v.tokens[1]] += 1
        accepted += v.accepted
    assert _chi2(first, p[0]) < CRITICAL
    assert _chi2(second, p[1]) < CRITICAL  # the second token, whenever emitted, follows p_1
    assert _chi2(drafted_first, p[0]) > 10 * CRITICAL  # the test can tell q from p: the drafts alone fail it
    assert 0 < accepted < ROUNDS * K


def test_a_drafter_equal_to_the_target_is_always_kept() -> None:
    p = mx.array(np.full((K + 1, V), 1 / V, np.float32))
    v = accept_sampled([1, 2, 3], p, p[:K], mx.random.key(7))
    assert v.accepted == K and v.tokens[:K] == (1, 2, 3) and len(v.tokens) == K + 1


def test_greedy_keeps_drafts_while_they_are_the_argmax() -> None:
    assert accept_greedy([5, 6, 7], [5, 6, 9, 1]).tokens == (5, 6, 9)
    assert accept_greedy([5, 6, 7], [5, 6, 7, 1]).tokens == (5, 6, 7, 1)
    assert accept_greedy([4], [5, 0]).tokens == (5,) and accept_greedy([4], [5, 0]).accepted == 0
