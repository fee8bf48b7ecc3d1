"""A sampled row's draw on the host (ext.split_key, ext.gumbel_at, RequestSampler's host path) is the one
MLX's own ops make, to the bit: the same subkeys, the same Gumbel noise, the same token for a seed."""

from __future__ import annotations

from types import ModuleType

import mlx.core as mx
import numpy as np
import pytest
from mlx_vlm import sample_utils as su

from gmlx_server.engine import sampling
from gmlx_server.engine.batch import _log_softmax
from gmlx_server.engine.kernels import KernelStatus
from gmlx_server.engine.sampling import RequestSampler
from gmlx_server.engine.types import SamplingParams


def _words(key: mx.array) -> tuple[int, int]:
    k0, k1 = np.array(key).tolist()
    return int(k0), int(k1)


def test_split_key_is_mlx_random_split(ext: ModuleType) -> None:
    for seed in (0, 1, 11, 2**32 + 5, 2**64 - 1):
        key, pair = mx.random.key(seed), (seed >> 32, seed & 0xFFFFFFFF)
        for _ in range(4):
            key, sub = mx.random.split(key)
            k0, k1, s0, s1 = ext.split_key(*pair)
            pair = (k0, k1)
            assert (k0, k1, s0, s1) == (*_words(key), *_words(sub))


@pytest.mark.parametrize("n", [1, 2, 7, 1000, 49152, 262144])
def test_categorical_at_is_mlx_random_categorical_to_the_bit(ext: ModuleType, n: int) -> None:
    """Rows -inf but at some positions (a nucleus), of every spread: peaked (exp underflows below -88), flat, one
    token; the draw from those positions alone is MLX's from the whole row, seed after seed."""
    rng = np.random.default_rng(n)
    for trial in range(40):
        m = int(rng.integers(1, min(n, 3000) + 1))
        idx = np.sort(rng.choice(n, size=m, replace=False)).astype(np.int64)
        vals = (rng.standard_normal(m) * (0.01, 1.0, 30.0, 200.0)[trial % 4]).astype(np.float32)
        row = np.full((1, n), -np.inf, dtype=np.float32)
        row[0, idx] = vals
        key = mx.random.key(trial * 7919 + n)
        assert ext.categorical_at(*_words(key), n, idx, vals) == mx.random.categorical(mx.array(row), key=key).item()
    with pytest.raises(IndexError):
        ext.categorical_at(1, 2, n, np.array([n], dtype=np.int64), np.zeros(1, np.float32))


def _mlx_chain(lp: mx.array, p: SamplingParams, key: mx.array) -> int:
    """mlx-vlm's filters in make_sampler's order, then categorical with the subkey."""
    if 0.0 < p.top_p < 1.0:
        lp = su.apply_top_p(lp, p.top_p)
    if p.top_k > 0:
        lp = su.apply_top_k(lp, p.top_k)
    return int(mx.random.categorical(lp * (1.0 / p.temperature), key=key).item())


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7, top_p=0.9),
                                    SamplingParams(temperature=1.0, top_p=0.95, top_k=64),
                                    SamplingParams(temperature=1.3, top_k=40)])
def test_a_seeded_host_draw_is_mlx_vlms_chain_token_for_token(ext: ModuleType, params: SamplingParams) -> None:
    rng = np.random.default_rng(5)
    for seed in range(12):
        p = SamplingParams(params.temperature, params.top_p, params.top_k, seed=seed)
        ours, key = RequestSampler(p, []), mx.random.key(seed)
        assert ours._host
        for _ in range(4):
            logits = mx.array(rng.standard_normal((1, 49152)).astype(np.float32) * 4)
            key, sub = mx.random.split(key)
            lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            assert ours(logits, None).token.item() == _mlx_chain(lp, p, sub)


def test_without_the_extension_a_seed_draws_the_same_tokens(ext: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Host draws and MLX's chain, and a host sampler whose nucleus is too wide for it (flat rows, drawn by MLX's
    chain from the host's subkey), give one token sequence."""
    rng = np.random.default_rng(9)
    scales = (3.0, 0.01, 3.0, 0.01, 5.0, 2.0)  # 0.01: a nucleus wider than the candidates
    rows = [mx.array(rng.standard_normal((1, 40000)).astype(np.float32) * s) for s in scales]
    p = SamplingParams(temperature=0.8, top_p=0.9, seed=42)
    hosted = RequestSampler(p, [])
    monkeypatch.setattr(sampling, "probe", lambda: KernelStatus(None, "off for this test"))
    chained = RequestSampler(p, [])
    assert hosted._host and not chained._host
    assert [hosted(r, None).token.item() for r in rows] == [chained(r, None).token.item() for r in rows]


def test_the_batchs_log_softmax_rows_are_each_rows_own() -> None:
    rng = np.random.default_rng(1)
    logits = mx.array(rng.standard_normal((4, 49152)).astype(np.float32) * 5)
    batch = np.array(_log_softmax(logits))
    for i in range(4):
        row = logits[i: i + 1]
        np.testing.assert_array_equal(batch[i: i + 1], np.array(row - mx.logsumexp(row, axis=-1, keepdims=True)))


def test_xtc_keeps_the_special_ids_it_is_given() -> None:
    """XTC cuts every token above its threshold but the least likely of them, never a special one: the ids
    reach it as the tokenizer's set (sorted once, for XTC alone)."""
    logits = mx.log(mx.array([[0.4, 0.3, 0.2, 0.05, 0.05]]))
    params = SamplingParams(temperature=1.0, xtc_probability=1.0, xtc_threshold=0.15, seed=3)
    kept, plain = RequestSampler(params, frozenset({0})), RequestSampler(params, frozenset())
    drawn = {int(kept(logits, None).token.item()) for _ in range(40)}
    assert 1 not in drawn and {0, 2} <= drawn
    cut = {int(plain(logits, None).token.item()) for _ in range(40)}
    assert 0 not in cut and 1 not in cut and 2 in cut  # without the special id, the most likely token goes too
