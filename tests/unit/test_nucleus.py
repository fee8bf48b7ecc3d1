"""top_p from the most probable candidates and top_k from the k-th value equal mlx-vlm's, which sort or argpartition
the whole vocabulary."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_vlm import sample_utils as su

from gmlx_server.engine import sampling
from gmlx_server.engine.sampling import RequestSampler, _nucleus_cut, top_k_filter, top_p_filter
from gmlx_server.engine.types import SamplingParams


def _logprobs(rng: np.random.Generator, rows: int, vocab: int, scale: float, holes: bool) -> mx.array:
    x = rng.standard_normal((rows, vocab)).astype(np.float32) * scale
    if holes:  # an earlier filter's -inf entries
        x[rng.random((rows, vocab)) < 0.3] = -np.inf
    lp = mx.array(x)
    return lp - mx.logsumexp(lp, axis=-1, keepdims=True)


def _exact(lp: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Per token, in float64: kept (the probability mass above it, exclusive, is under top_p of the whole) and
    how far that mass is from the cut, relative to the whole."""
    probs = np.exp(lp.astype(np.float64))
    order = np.argsort(-lp, kind="stable")
    above = np.empty_like(probs)
    above[order] = np.cumsum(probs[order]) - probs[order]
    total = probs.sum()
    # tied tokens share the cut: a tie is kept when any of its copies is
    kept = lp >= lp[order][np.count_nonzero(above[order] < top_p * total) - 1]
    return kept, np.abs(above - top_p * total) / total


@pytest.mark.parametrize("vocab", [5, 1000, 49152, 262144])
@pytest.mark.parametrize("scale", [0.5, 3.0, 8.0, 14.0])
def test_the_nucleus_is_the_exact_one(vocab: int, scale: float) -> None:
    """Against float64: equal but for tokens within 1e-6 of the cut (float32 log-probabilities' own rounding);
    a nucleus wider than the candidates is mlx-vlm's own (its float32 scan, up to ~5e-4 off at 262K)."""
    rng = np.random.default_rng(vocab + int(scale * 10))
    for top_p in (0.1, 0.5, 0.9, 0.95, 0.999):
        for rows, holes in ((1, False), (2, True)):
            lp = _logprobs(rng, rows, vocab, scale, holes)
            got = np.array(top_p_filter(lp, top_p))
            if any(_nucleus_cut(row, top_p) is None for row in np.array(lp)):
                np.testing.assert_array_equal(got, np.array(su.apply_top_p(lp, top_p)))
                continue
            for row_lp, row_got in zip(np.array(lp), got, strict=True):
                kept, gap = _exact(row_lp, top_p)
                differ = np.isfinite(row_got) != kept
                assert not differ.any() or gap[differ].max() < 1e-6, (top_p, int(differ.sum()))
                np.testing.assert_array_equal(row_got[kept & ~differ], row_lp[kept & ~differ])


@pytest.mark.parametrize("scale", [8.0, 14.0])
def test_a_small_nucleus_equals_mlx_vlms(scale: float) -> None:
    rng = np.random.default_rng(int(scale))
    for top_p in (0.1, 0.5, 0.9, 0.95):
        lp = _logprobs(rng, 2, 262144, scale, True)
        np.testing.assert_array_equal(np.array(top_p_filter(lp, top_p)), np.array(su.apply_top_p(lp, top_p)))


def test_a_peaked_row_is_cut_from_the_candidates_and_a_flat_one_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    peaked = np.array(_logprobs(rng, 1, 262144, 10.0, False))[0]
    flat = np.array(_logprobs(rng, 1, 262144, 0.5, False))[0]
    assert _nucleus_cut(peaked, 0.9) is not None
    assert _nucleus_cut(flat, 0.9) is None
    calls: list[float] = []
    full = su.apply_top_p
    monkeypatch.setattr(sampling.su, "apply_top_p", lambda x, p: calls.append(p) or full(x, p))
    top_p_filter(mx.array(peaked[None]), 0.9)
    assert calls == []
    top_p_filter(mx.array(flat[None]), 0.9)
    assert calls == [0.9]


def test_a_seeded_draw_is_the_one_mlx_vlms_chain_gives() -> None:
    rng = np.random.default_rng(7)
    logits = mx.array(rng.standard_normal((1, 49152)).astype(np.float32) * 6)
    params = SamplingParams(temperature=0.7, top_p=0.9, seed=11)
    ours = [RequestSampler(params, [])(logits, None).token.item() for _ in range(2)]
    key = mx.random.key(11)
    _, sub = mx.random.split(key)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    theirs = mx.random.categorical(su.apply_top_p(lp, 0.9) * (1 / 0.7), key=sub).item()
    assert ours == [theirs, theirs]


@pytest.mark.parametrize("vocab", [70, 49152, 262144])
def test_top_k_equals_mlx_vlms(vocab: int) -> None:
    rng = np.random.default_rng(vocab)
    for k in (1, 20, 64):
        for holes in (False, True):  # with holes, fewer than k finite tokens may be left
            lp = _logprobs(rng, 2, vocab, 4.0, holes)
            if holes:
                lp = mx.where(mx.array(rng.random((2, vocab)) < 0.999), -mx.inf, lp)
            np.testing.assert_array_equal(np.array(top_k_filter(lp, k)), np.array(su.apply_top_k(lp, k)))
