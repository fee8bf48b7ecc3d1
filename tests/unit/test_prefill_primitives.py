"""The kernels' prefill primitives against float64: blockwise (flash) attention for many query rows, and the
gated activations (SiLU, GELU's tanh form) the MLPs call; a model's Primitives route float32 to them."""

from __future__ import annotations

import math
from types import ModuleType

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gmlx_server.engine.kernels.fast_ops import GELU_TANH, SILU, Primitives
from tests.unit.test_fast_ops import check_sdpa


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 2), hk=st.sampled_from([1, 3]), r=st.sampled_from([1, 3, 4]),
       lq=st.one_of(st.integers(16, 150), st.integers(1, 8)),
       extra=st.one_of(st.integers(0, 70), st.integers(250, 700)), d=st.sampled_from([16, 64, 80, 256]),
       kind=st.sampled_from(["none", "causal", "bool", "add", "bool2d"]), seed=st.integers(0, 2**16),
       half=st.booleans())
def test_flash_attention_matches_float64(ext: ModuleType, b: int, hk: int, r: int, lq: int, extra: int, d: int,
                                         kind: str, seed: int, half: bool) -> None:
    """From 16 query rows, or 64 keys, the primitive runs blockwise: every key block, the causal diagonal, a
    chunk's keys beyond its queries (extra), ragged ends, masks of each kind, a row masked throughout, and
    (few tasks over many keys: decode at a long context) keys split across tasks and merged; over fp32 or
    float16 keys and values (half: a float16 KV cache, widened in registers)."""
    check_sdpa(ext, b, hk, r, lq, extra, d, kind, seed, half)


def test_cpu_attention_takes_the_primitive_for_prefill_rows(ext: ModuleType) -> None:
    from gmlx_server.engine.attention import cpu_attention

    prims = Primitives(ext)
    q, k, v = mx.random.normal((1, 9, 40, 64)), mx.random.normal((1, 3, 90, 64)), mx.random.normal((1, 3, 90, 64))
    assert mx.array_equal(cpu_attention(q, k, v, 0.2, "causal", prims), ext.sdpa(q, k, v, 0.2, None, causal=True))
    odd = mx.random.normal((1, 3, 90, 72))  # value rows not a multiple of 16 wide: MLX's ops, same result
    got = cpu_attention(q, k, odd, 0.2, "causal", prims)
    assert mx.abs(got - ext.sdpa(q, k, odd, 0.2, None, causal=True)).max() < 1e-5


def _act_ref(x: np.ndarray, kind: int) -> np.ndarray:
    if kind == 0:
        return x / (1 + np.exp(-x))
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize("kind", [0, 1])
@pytest.mark.parametrize("shape", [(1, 512, 96), (3, 7, 33), (5,), (2, 1, 1, 17)])
@pytest.mark.parametrize("with_up", [True, False])
def test_gated_matches_float64(ext: ModuleType, kind: int, shape: tuple[int, ...], with_up: bool) -> None:
    """Tails shorter than a vector, one row, leading size-1 dimensions, and inputs wide enough to saturate."""
    rng = np.random.default_rng(kind * 7 + len(shape))
    g = (rng.normal(size=shape) * 6).astype(np.float32)
    g.flat[:4] = [-120.0, 120.0, 0.0, -30.0]  # far into both tails: no overflow, no NaN
    u = rng.normal(size=shape).astype(np.float32)
    got = np.array(ext.gated(mx.array(g), mx.array(u) if with_up else None, kind))
    want = _act_ref(g.astype(np.float64), kind) * (u if with_up else 1.0)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


def test_attention_and_activations_run_on_every_isa(ext: ModuleType) -> None:
    """Attention and the activations are chosen by cpuid like the matmuls: each table the CPU can run
    (set_isa) computes them within the same tolerance, the generic one included."""
    first = ext.isa()
    rng = np.random.default_rng(3)
    g, u = (rng.normal(size=(3, 77)) * 6).astype(np.float32), rng.normal(size=(3, 77)).astype(np.float32)
    try:
        for isa in ext.isas():
            ext.set_isa(isa)
            assert ext.isa() == isa
            for half in (False, True):  # fp32 and float16 KV (F16C's vcvtph2ps, or the generic table's bits)
                check_sdpa(ext, 1, 3, 3, 4, 30, 72, "bool", seed=1, half=half)  # few rows: one row at a time
                check_sdpa(ext, 2, 1, 4, 40, 300, 80, "causal", seed=2, half=half)  # flash, keys split across tasks
            for kind in (0, 1):
                want = _act_ref(g.astype(np.float64), kind) * u
                np.testing.assert_allclose(np.array(ext.gated(mx.array(g), mx.array(u), kind)), want,
                                           rtol=2e-6, atol=1e-6)
    finally:
        ext.set_isa(first)


def test_gated_reads_a_fused_projections_column_slices(ext: ModuleType) -> None:
    """A fused gate/up output is one (rows, 2n) array whose halves the MLP takes as strided views."""
    y = mx.random.normal((2, 50, 2 * 72)) * 3
    gate, up = y[..., :72], y[..., 72:]
    want = _act_ref(np.array(gate).astype(np.float64), 0) * np.array(up)
    np.testing.assert_allclose(np.array(ext.gated(gate, up, 0)), want, rtol=2e-6, atol=1e-6)
    for kind in (0, 1):  # halves: the fused output itself, no slices; the same values as the two views
        assert mx.array_equal(ext.gated(y, None, kind, halves=True), ext.gated(gate, up, kind))
        np.testing.assert_allclose(np.array(Primitives(ext).gated_halves(y, kind)),  # and MLX's ops without it
                                   np.array(Primitives(None).gated_halves(y, kind)), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="halves"):
        ext.gated(y[..., :71], None, 0, halves=True)
    t = mx.random.normal((40, 3, 16)).transpose(1, 0, 2)  # no uniform row stride: a row-major copy
    np.testing.assert_allclose(np.array(ext.gated(t, None, 1)), _act_ref(np.array(t).astype(np.float64), 1),
                               rtol=2e-6, atol=1e-6)


def test_float32_activations_go_to_the_primitive_and_the_rest_to_mlx(ext: ModuleType) -> None:
    from mlx_vlm.models.activations import swiglu

    prims = Primitives(ext)
    g, u = mx.random.normal((3, 40)), mx.random.normal((3, 40))
    assert mx.array_equal(prims.gated(g, u, SILU), ext.gated(g, u, 0))
    assert mx.array_equal(prims.gated(g, u, GELU_TANH), ext.gated(g, u, 1))
    half = g.astype(mx.bfloat16)  # not ours: MLX's own function, in its own dtype
    assert prims.gated(half, half, GELU_TANH).dtype == prims.gated(half, half, SILU).dtype == mx.bfloat16
    off = Primitives(None)  # the kernels off: mlx-vlm's and MLX's own, bit for bit
    assert mx.array_equal(off.gated(g, u, SILU), swiglu(g, u))
    assert mx.array_equal(off.gated(g, u, GELU_TANH), nn.gelu_approx(g) * u)
