"""RMSNorm and RoPE as single CPU primitives (engine/kernels/fast_ops.py) against float64 references.

A model's gmlx modules call them through its Primitives for float32 on the CPU; anything else (other dtypes,
shapes they do not cover) must still reach MLX's own function.
"""

from __future__ import annotations

from types import ModuleType

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gmlx_server.engine.kernels.fast_ops import Primitives, RopeArgs

F64 = np.ndarray


def rms_ref(x: F64, w: F64 | None, eps: float) -> F64:
    y = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    out: F64 = y * w if w is not None else y
    return out


def rope_ref(x: F64, dims: int, traditional: bool, base: float | None, scale: float, offsets: F64,
             freqs: F64 | None) -> F64:
    """x (B, N, T, D); offsets (B,)."""
    half = dims // 2
    periods = freqs if freqs is not None else base ** (np.arange(half) * 2.0 / dims)  # type: ignore[operator]
    pos = (offsets[:, None] + np.arange(x.shape[2])[None]) * scale  # (B, T)
    theta = pos[:, None, :, None] / periods  # (B, 1, T, half)
    c, s = np.cos(theta), np.sin(theta)
    out = x.copy()
    i1 = np.arange(half) * 2 if traditional else np.arange(half)
    i2 = i1 + 1 if traditional else i1 + half
    x1, x2 = x[..., i1], x[..., i2]
    out[..., i1], out[..., i2] = x1 * c - x2 * s, x1 * s + x2 * c
    return out


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 9), d=st.sampled_from([1, 7, 64, 576, 640]), weighted=st.booleans(),
       transposed=st.booleans(), seed=st.integers(0, 2**16))
def test_rms_norm_matches_float64(ext: ModuleType, rows: int, d: int, weighted: bool, transposed: bool,
                                  seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(d, rows) if transposed else (rows, d)).astype(np.float32) * 3
    w = rng.normal(size=d).astype(np.float32) if weighted else None
    xa = mx.array(x).T if transposed else mx.array(x)  # a strided view: read through its strides
    got = np.array(ext.rms_norm(xa, mx.array(w) if w is not None else None, 1e-5))
    want = rms_ref((x.T if transposed else x).astype(np.float64), w, 1e-5)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 3), n=st.integers(1, 4), t=st.integers(1, 6), d=st.sampled_from([8, 32, 64, 80]),
       part=st.booleans(), traditional=st.booleans(), per_row=st.booleans(), use_freqs=st.booleans(),
       scale=st.sampled_from([1.0, 0.25]), layout=st.sampled_from(["bntd", "btnd", "btd", "5d"]),
       seed=st.integers(0, 2**16))
def test_rope_matches_float64(ext: ModuleType, b: int, n: int, t: int, d: int, part: bool, traditional: bool,
                              per_row: bool, use_freqs: bool, scale: float, layout: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    dims = d // 2 if part else d
    offsets = rng.integers(0, 3000, size=b) if per_row else np.full(b, rng.integers(0, 3000))
    freqs = rng.uniform(1.0, 500.0, size=dims // 2).astype(np.float32) if use_freqs else None
    x = rng.normal(size=(b, t, n, d)).astype(np.float32)
    xa = mx.array(x).transpose(0, 2, 1, 3)  # how attention hands queries over: a strided view
    ref_in = x.transpose(0, 2, 1, 3)
    if layout == "btnd":
        xa, ref_in = mx.array(np.ascontiguousarray(ref_in)), ref_in
    elif layout == "btd":
        xa, ref_in = xa[:, 0], ref_in[:, :1]
    elif layout == "5d":
        xa, ref_in = mx.expand_dims(xa, 1), ref_in
    off: int | mx.array = mx.array(offsets.astype(np.int32)) if per_row else int(offsets[0])
    got = np.array(ext.rope(xa, dims, traditional=traditional, base=None if use_freqs else 10000.0, scale=scale,
                            offset=off, freqs=mx.array(freqs) if freqs is not None else None))
    want = rope_ref(ref_in.astype(np.float64), dims, traditional, 10000.0, scale, offsets.astype(np.float64),
                    freqs.astype(np.float64) if freqs is not None else None)
    # float32 angles at positions up to ~3000 radians carry ~1e-4 absolute error (MLX's own rope: ~2x that)
    np.testing.assert_allclose(got.reshape(want.shape), want, atol=1e-3, rtol=0)


def test_float32_goes_to_the_primitives(ext: ModuleType) -> None:
    prims = Primitives(ext)
    x = mx.random.normal((1, 4, 3, 64))
    w = mx.random.normal((64,))
    assert mx.array_equal(prims.rms_norm(x, w, 1e-6), ext.rms_norm(x, w, 1e-6))
    ours = ext.rope(x, 64, traditional=False, base=1e4, scale=1.0, offset=5)
    assert mx.array_equal(prims.rope(x, RopeArgs(64, False, 1e4, 1.0), 5), ours)


def test_what_the_primitives_do_not_cover_reaches_mlx(ext: ModuleType) -> None:
    prims = Primitives(ext)
    x16 = mx.random.normal((1, 2, 3, 32)).astype(mx.bfloat16)
    y = prims.rope(x16, RopeArgs(32, False, 1e4, 1.0), 0)
    assert y.dtype == mx.bfloat16
    w2 = mx.ones((2, 32))  # a weight that is not 1-D
    with pytest.raises(ValueError):
        prims.rms_norm(mx.ones((2, 32)), w2, 1e-6)  # MLX's own error, not a crash in the extension


def test_without_the_extension_mlx_runs(ext: ModuleType) -> None:
    """Primitives(None) (the kernels off) gives MLX's own results, bit for bit."""
    x, w = mx.random.normal((2, 3, 5, 32)), mx.random.normal((32,))
    off = Primitives(None)
    assert mx.array_equal(off.rms_norm(x, w, 1e-5), mx.fast.rms_norm(x, w, 1e-5))
    want = mx.fast.rope(x, 32, traditional=True, base=1e4, scale=1.0, offset=3)
    assert mx.array_equal(off.rope(x, RopeArgs(32, True, 1e4, 1.0), 3), want)


def sdpa_ref(q: F64, k: F64, v: F64, scale: float, mask: F64 | None, causal: bool) -> F64:
    """q (B, H, L, D), k/v (B, Hk, S, D); mask bool or additive, broadcast to (B, H, L, S)."""
    r = q.shape[1] // k.shape[1]
    kk, vv = np.repeat(k, r, axis=1), np.repeat(v, r, axis=1)
    s = np.einsum("bhld,bhsd->bhls", q, kk) * scale
    L, S = q.shape[2], k.shape[2]
    if causal:
        s = np.where(np.arange(S)[None] <= np.arange(S - L, S)[:, None], s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, np.finfo(np.float32).min) if mask.dtype == bool else s + mask
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    out: F64 = np.einsum("bhls,bhsd->bhld", e / e.sum(axis=-1, keepdims=True), vv)
    return out


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 3), hk=st.sampled_from([1, 2, 3]), r=st.sampled_from([1, 3, 4]), lq=st.integers(1, 8),
       extra=st.integers(0, 40), d=st.sampled_from([16, 64, 72]), kind=st.sampled_from(["none", "causal", "bool",
                                                                                          "add", "bool2d"]),
       seed=st.integers(0, 2**16), half=st.booleans())
def test_sdpa_matches_float64(ext: ModuleType, b: int, hk: int, r: int, lq: int, extra: int, d: int, kind: str,
                              seed: int, half: bool) -> None:
    check_sdpa(ext, b, hk, r, lq, extra, d, kind, seed, half)


@settings(max_examples=25, deadline=None)
@given(hk=st.sampled_from([1, 2, 3]), r=st.sampled_from([1, 3, 7]), lq=st.integers(1, 4), extra=st.integers(60, 400),
       d=st.sampled_from([16, 32, 48, 64, 80, 256]), kind=st.sampled_from(["none", "causal", "add"]),
       seed=st.integers(0, 2**16), half=st.booleans())
def test_sdpa_decode_over_many_keys_matches_float64(ext: ModuleType, hk: int, r: int, lq: int, extra: int, d: int,
                                                    kind: str, seed: int, half: bool) -> None:
    """A few query rows over 64 keys or more (decode at depth) take the key-block path; every count of
    value vectors a block weighs in registers (1 to 4 of 16 floats, and 16 for Gemma's 256)."""
    check_sdpa(ext, 1, hk, r, lq, extra, d, kind, seed, half)


def check_sdpa(ext: ModuleType, b: int, hk: int, r: int, lq: int, extra: int, d: int, kind: str, seed: int,
               half: bool = False) -> None:
    """ext.sdpa on random q/k/v (keys sliced from a longer cache buffer) and a mask of `kind` vs float64; `half`:
    keys and values held as float16 (a float16 KV cache), the reference taking the same rounded values."""
    rng = np.random.default_rng(seed)
    h, s = hk * r, lq + extra
    kv = np.float16 if half else np.float32
    q = rng.normal(size=(b, lq, h, d)).astype(np.float32) * 2
    k = (rng.normal(size=(b, hk, s + 5, d)) * 3).astype(kv)  # a cache buffer longer than what is used
    v = rng.normal(size=(b, hk, s + 5, d)).astype(kv)
    mask: np.ndarray | None = None
    if kind == "bool":
        mask = rng.random(size=(b, 1, lq, s)) > 0.3
    elif kind == "add":
        mask = rng.normal(size=(b, 1, lq, s)).astype(np.float32)
    elif kind == "bool2d":
        mask = rng.random(size=(lq, s)) > 0.5
        mask[min(3, lq - 1)] = False  # a query row masked throughout averages, as MLX's finfo.min does
    qa = mx.array(q).transpose(0, 2, 1, 3)
    ka, va = mx.array(k)[:, :, :s], mx.array(v)[:, :, :s]
    got = np.array(ext.sdpa(qa, ka, va, 0.125, mx.array(mask) if mask is not None else None,
                            causal=kind == "causal"))
    want = sdpa_ref(q.transpose(0, 2, 1, 3).astype(np.float64), k[:, :, :s].astype(np.float64),
                    v[:, :, :s].astype(np.float64), 0.125, mask, kind == "causal")
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)


def test_cpu_attention_takes_the_primitive_for_few_rows(ext: ModuleType) -> None:
    from gmlx_server.engine.attention import cpu_attention

    q, k, v = mx.random.normal((1, 4, 2, 32)), mx.random.normal((1, 2, 9, 32)), mx.random.normal((1, 2, 9, 32))
    got = cpu_attention(q, k, v, 0.2, "causal", Primitives(ext))
    assert mx.array_equal(got, ext.sdpa(q, k, v, 0.2, None, causal=True))
    kh, vh = k.astype(mx.float16), v.astype(mx.float16)  # a float16 KV cache: read as stored, not promoted
    assert mx.array_equal(cpu_attention(q, kh, vh, 0.2, "causal", Primitives(ext)),
                          ext.sdpa(q, kh, vh, 0.2, None, causal=True))
    off = cpu_attention(q, kh, vh, 0.2, "causal", Primitives(None))  # MLX's ops promote it to float32
    assert off.dtype == mx.float32 and mx.abs(off - ext.sdpa(q, kh, vh, 0.2, None, causal=True)).max() < 1e-5


@pytest.mark.parametrize("rows", [1, 5, 40])
def test_sdpa_reads_strided_float16_keys(ext: ModuleType, rows: int) -> None:
    """Keys whose last dimension is not contiguous are gathered (element size 2) before the kernels read them."""
    q = mx.random.normal((1, 4, rows, 32))
    kt = mx.random.normal((1, 2, 32, 300)).astype(mx.float16)  # (B, Hk, D, S): swapped below, stride 300
    v = mx.random.normal((1, 2, 300, 32)).astype(mx.float16)
    k = kt.swapaxes(-1, -2)
    got = ext.sdpa(q, k, v, 0.2, None, causal=True)
    assert mx.abs(got - ext.sdpa(q, mx.contiguous(k), v, 0.2, None, causal=True)).max() < 1e-6


def test_sdpa_refuses_mixed_kv_dtypes(ext: ModuleType) -> None:
    q, k = mx.random.normal((1, 2, 1, 16)), mx.random.normal((1, 1, 8, 16))
    with pytest.raises(ValueError, match="both float32 or both float16"):
        ext.sdpa(q, k.astype(mx.float16), k, 0.2, None, causal=False)
    with pytest.raises(ValueError, match="float32 queries"):
        ext.sdpa(q.astype(mx.float16), k, k, 0.2, None, causal=False)
