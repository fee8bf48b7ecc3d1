"""Issue 29 item 3, fewer ops a layer: each residual add fused with the norm after it (GKAddNorm, kernels/blocks.py)
and both computed by the sublayer's last projection's matmul, a projection's bias added by its matmul and an MLP's
gate computed by its down projection's matmul; and the batch's
argmax over the vocabulary as one vector primitive.
The same results as the separate ops, to the bit, and the graph nodes they save."""

from __future__ import annotations

import re
import tempfile
from collections import Counter
from collections.abc import Callable
from types import ModuleType

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from hypothesis import given, settings
from hypothesis import strategies as st

from gmlx_server.engine import loader
from gmlx_server.engine.batch import _as_batch
from gmlx_server.engine.kernels import blocks, fast_ops, probe
from gmlx_server.engine.kernels.fast_ops import Primitives
from gmlx_server.engine.sampling import RequestSampler
from gmlx_server.engine.types import SamplingParams
from tests.conftest import gemma_path, qwen_coder_path, smollm2_path
from tests.unit.test_heads_attention import _steps
from tests.unit.test_kernels import random_blocks


def _normal(rng: np.random.Generator, *shape: int) -> mx.array:
    return mx.array(rng.standard_normal(shape).astype(np.float32))


@pytest.mark.parametrize("case", range(6))
def test_add_norm_equals_the_add_and_the_norms(ext: ModuleType, case: int) -> None:
    rng = np.random.default_rng(case)
    rows, d = (1, 3, 7)[case % 3], (64, 576, 40)[case % 3]
    x, r = _normal(rng, 2, rows, d), _normal(rng, 2, rows, d)
    if case == 4:  # strided inputs are read as they are laid out
        x, r = _normal(rng, 2, d, rows).swapaxes(1, 2), _normal(rng, rows, 2, d).swapaxes(0, 1)
    w, rw = (mx.array(rng.uniform(0.5, 2, d).astype(np.float32)) for _ in range(2))
    sandwich = case % 2 == 1
    h, y = ext.add_norm(x, r, rw if sandwich else None, w, eps=1e-6, r_eps=1e-5)
    want_h = x + (ext.rms_norm(r, rw, 1e-5) if sandwich else r)
    np.testing.assert_array_equal(np.array(h), np.array(want_h))
    np.testing.assert_array_equal(np.array(y), np.array(ext.rms_norm(want_h, w, 1e-6)))
    ref = np.array(want_h, dtype=np.float64)  # and the norm against float64
    ref = ref / np.sqrt((ref**2).mean(-1, keepdims=True) + 1e-6) * np.array(w, dtype=np.float64)
    np.testing.assert_allclose(np.array(y), ref, rtol=1e-5, atol=1e-5)


def test_add_norm_refuses_bad_arguments(ext: ModuleType) -> None:
    x, w = mx.zeros((1, 2, 8)), mx.ones((8,))
    with pytest.raises(ValueError, match="one shape"):
        ext.add_norm(x, mx.zeros((1, 1, 8)), None, w, eps=1e-6)
    with pytest.raises(ValueError, match="float32"):
        ext.add_norm(x.astype(mx.float16), x, None, w, eps=1e-6)
    with pytest.raises(ValueError, match="weights"):
        ext.add_norm(x, x, mx.ones((4,)), w, eps=1e-6)


@pytest.mark.parametrize("case", range(4))
def test_matmul_adds_its_bias_as_the_add_did(ext: ModuleType, case: int) -> None:
    rng = np.random.default_rng(case)
    name, k = (("Q8_0", 64), ("Q4_K", 256), ("Q4_0", 96), ("Q6_K", 256))[case]
    n, rows = 24, (1, 3, 9, 64)[case]  # a decode row, a few, and sgemm's panels
    blocks, qtype = mx.array(random_blocks(rng, name, n, k)), int(GGMLQuantizationType[name])
    x, bias = _normal(rng, rows, k), _normal(rng, n)
    got = ext.matmul(x, blocks, qtype, k, bias=bias)
    np.testing.assert_array_equal(np.array(got), np.array(ext.matmul(x, blocks, qtype, k) + bias))
    with pytest.raises(ValueError, match="bias must be float32"):
        ext.matmul(x.astype(mx.float16), blocks, qtype, k, bias=bias)
    with pytest.raises(ValueError, match="bias must be float32"):
        ext.matmul(x, blocks, qtype, k, bias=bias[:-1])


@pytest.mark.parametrize("case", range(6))
def test_matmul_gates_its_rows_as_gated_did(ext: ModuleType, case: int) -> None:
    """An MLP's down projection takes act(gate) * up as its rows, computed as GKGated computes them: the same
    products to the bit, for a fused gate/up output (halves) and for separate gate and up, strided or not."""
    rng = np.random.default_rng(case)
    name, k = (("Q8_0", 64), ("Q4_K", 256), ("Q5_0", 96), ("Q6_K", 256), ("Q4_1", 64), ("Q4_K", 512))[case]
    n, rows, kind = 24, (1, 3, 9, 64, 2, 5)[case], case % 2
    blocks, qtype = mx.array(random_blocks(rng, name, n, k)), int(GGMLQuantizationType[name])
    y = _normal(rng, rows, 2 * k)
    if case == 4:  # a fused output's rows read where they lie, one wider row apart
        y = _normal(rng, rows, 3 * k)[:, k:]
    got = ext.matmul(y, blocks, qtype, k, gate=kind)
    want = ext.matmul(ext.gated(y, None, kind, halves=True), blocks, qtype, k)
    np.testing.assert_array_equal(np.array(got), np.array(want))
    g, u = _normal(rng, 2, rows, k), _normal(rng, 2, rows, k)
    if case == 5:
        g = _normal(rng, rows, 2, k).swapaxes(0, 1)
    want = ext.matmul(ext.gated(g, u, kind), blocks, qtype, k)
    np.testing.assert_array_equal(np.array(ext.matmul(g, blocks, qtype, k, gate=kind, up=u)), np.array(want))


def test_a_gated_matmul_refuses_bad_arguments(ext: ModuleType) -> None:
    rng = np.random.default_rng(0)
    blocks, qtype, k = mx.array(random_blocks(rng, "Q8_0", 8, 64)), int(GGMLQuantizationType["Q8_0"]), 64
    x = mx.zeros((2, 2 * k))
    bad = (({"gate": 2}, "gate -1"), ({"gate": -2}, "gate -1"), ({"up": x}, "only with a gate"),
           ({"gate": 0, "up": x}, "a gate takes x"), ({"gate": 1, "up": mx.zeros((2, k))}, "a gate takes x"))
    for kwargs, match in bad:
        with pytest.raises(ValueError, match=match):
            ext.matmul(x, blocks, qtype, k, **kwargs)
    with pytest.raises(ValueError, match="float32"):
        ext.matmul(x.astype(mx.float16), blocks, qtype, k, gate=0)
    with pytest.raises(ValueError, match="a gate takes x"):
        ext.matmul(mx.zeros((2, k)), blocks, qtype, k, gate=0)  # halves need 2k columns


@pytest.mark.parametrize("case", range(6))
def test_matmul_add_norm_is_the_matmul_then_add_norm(ext: ModuleType, case: int) -> None:
    """A sublayer's last projection with the residual add and norm after it as its epilogue: the same sum and
    norm as the matmul then GKAddNorm, to the bit: plain, biased, gated (halves and separate up), a sandwich's
    normed product, and sgemm's rows."""
    rng = np.random.default_rng(case)
    name, k = (("Q8_0", 64), ("Q4_K", 256), ("Q5_0", 96), ("Q6_K", 256), ("Q4_1", 64), ("Q4_K", 512))[case]
    n, rows = 32, (1, 3, 9, 64, 2, 5)[case]
    blocks, qtype = mx.array(random_blocks(rng, name, n, k)), int(GGMLQuantizationType[name])
    w, rw = (mx.array(rng.uniform(0.5, 2, n).astype(np.float32)) for _ in range(2))
    residual = _normal(rng, 1, rows, n)
    x, gate, up, bias = _normal(rng, 1, rows, k), -1, None, None
    if case in (1, 4):  # a gated down projection: a fused gate/up output, or separate gate and up
        x, gate = _normal(rng, 1, rows, 2 * k), case % 2
        if case == 4:
            x, up = x[..., :k], _normal(rng, 1, rows, k)
    if case == 2:
        bias = _normal(rng, n)
    r_weight = rw if case in (3, 4) else None  # Gemma 3's sandwich: the product normed before the add
    product = ext.matmul(x, blocks, qtype, k, bias=bias, gate=gate, up=up)
    want = ext.add_norm(residual, product, r_weight, w, 1e-6, 1e-5)
    got = ext.matmul_add_norm(x, blocks, qtype, k, residual, w, 1e-6, r_weight=r_weight, r_eps=1e-5, bias=bias,
                              gate=gate, up=up)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.array(a), np.array(b))


def test_matmul_add_norm_refuses_bad_arguments(ext: ModuleType) -> None:
    rng = np.random.default_rng(0)
    blocks, qtype, k = mx.array(random_blocks(rng, "Q8_0", 8, 64)), int(GGMLQuantizationType["Q8_0"]), 64
    x, res, w = mx.zeros((2, k)), mx.zeros((2, 8)), mx.ones((8,))
    bad = (((x.astype(mx.float16), res, w), "float32 x and residual"), ((x, res.astype(mx.float16), w), "float32 x"),
           ((x, mx.zeros((1, 8)), w), "the product's shape"), ((x, res, mx.ones((4,))), "weights must be 1-D"),
           ((mx.zeros((2, 32)), res, w), "last dimension must be k"))
    for (a, r, nw), match in bad:
        with pytest.raises(ValueError, match=match):
            ext.matmul_add_norm(a, blocks, qtype, k, r, nw, 1e-6)
    with pytest.raises(ValueError, match="weights must be 1-D"):
        ext.matmul_add_norm(x, blocks, qtype, k, res, w, 1e-6, r_weight=mx.ones((3,)))


SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 3.0]


@given(st.lists(st.sampled_from(SPECIAL[1:]) | st.floats(-4, 4, width=32), min_size=1, max_size=70),
       st.integers(0, 69), st.booleans())
@settings(max_examples=200, deadline=None)
def test_argmax_is_mlxs(values: list[float], at: int, with_nan: bool) -> None:
    """The first index of the maximum, ties, infinities and signed zeros, and the first NaN wins, as mx.argmax."""
    ext = probe().ext
    if ext is None:
        pytest.skip("no kernels")
    row = np.array(values, dtype=np.float32)
    if with_nan:
        row[at % row.size] = np.nan
    x = mx.array(np.stack([row, row[::-1], np.sort(row)]))
    assert ext.argmax(x).tolist() == mx.argmax(x, axis=-1).tolist()


@pytest.mark.parametrize("case", range(3))
def test_argmax_over_a_vocabulary(ext: ModuleType, case: int) -> None:
    rng = np.random.default_rng(case)
    shape = ((1, 49152), (4, 262144), (2, 3, 151936))[case]
    x = mx.array(rng.standard_normal(shape).astype(np.float32))
    got = ext.argmax(x)
    assert got.dtype == mx.uint32 and mx.array_equal(got, mx.argmax(x, axis=-1))
    if case == 1:  # strided rows (a batch's last positions) read as laid out
        x = mx.array(rng.standard_normal((4, 2, 4096)).astype(np.float32))[:, 1, :]
        assert mx.array_equal(ext.argmax(x), mx.argmax(x, axis=-1))
    prims = Primitives(ext)
    half = x.astype(mx.float16)  # what the primitive does not take goes to MLX's own
    assert mx.array_equal(prims.argmax(half), mx.argmax(half, axis=-1))
    with pytest.raises(ValueError, match="float32"):
        ext.argmax(half)


def test_a_greedy_sampler_with_processors_takes_the_primitive(ext: ModuleType) -> None:
    """A greedy row with a logit bias (or penalties, or a grammar) draws its own argmax: the primitive's too."""
    logits = mx.array(np.random.default_rng(0).standard_normal((1, 5000)).astype(np.float32))
    top = int(mx.argmax(logits, axis=-1).item())
    draw = RequestSampler(SamplingParams(temperature=0.0, logit_bias={top: -100.0}), [])(logits, None)
    with tempfile.NamedTemporaryFile("r", suffix=".dot") as f:
        mx.export_to_dot(f.name, draw.token)
        assert "GKArgMax" in f.read()
    biased = logits + mx.array(np.eye(5000, dtype=np.float32)[top] * -100.0)
    assert draw.token.tolist() == mx.argmax(biased, axis=-1).tolist() != [top]


def _step_ops(lm: loader.LoadedModel) -> Counter[str]:
    cache = [_as_batch(c) for c in lm.make_cache()]
    mx.eval(lm.model(mx.array([list(range(1, 40))]), cache=cache).logits)
    for t in (5, 6):
        mx.eval(lm.model(mx.array([[t]]), cache=cache).logits)
    with tempfile.NamedTemporaryFile("r", suffix=".dot") as f:
        mx.export_to_dot(f.name, lm.model(mx.array([[7]]), cache=cache).logits)
        return Counter(re.findall(r'label ="([A-Za-z]+)', f.read()))


@pytest.mark.slow
@pytest.mark.parametrize("path", [smollm2_path, gemma_path])
def test_fused_blocks_keep_the_logits(ext: ModuleType, path: Callable[[], str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    ours = loader.load_gguf_model(path())
    ops = _step_ops(ours)
    layers = len(ours.model.model.layers)
    # every layer's adds and norms ride its o_proj's and down projection's matmuls; only the first layer's input
    # norm runs alone (the final norm was computed by the last layer's down projection); the one Add a layer left
    # is its cache's offsets; each MLP's gate is computed by its down projection's matmul too
    assert ops["GKAddNorm"] == 0 and ops["GKRMSNorm"] == 1 and ops["Add"] <= layers + 1
    assert ops["GKGated"] == 0
    modules = [id(m) for _, m in ours.model.named_modules()]
    assert len(modules) == len(set(modules))  # the MLP only notes that its down projection gates: no second child
    # the fused layers with their adds and norms as ops of their own (each sublayer projects itself)
    cases = [(half, batch) for half in (False, True) for batch in (False, True)]
    with monkeypatch.context() as m:
        m.setattr(blocks, "_sublayer", lambda module, *args: module(*args))
        apart = loader.load_gguf_model(path())
        assert _step_ops(apart)["GKAddNorm"] == 2 * layers
        apart_steps = [_steps(apart, half, batch) for half, batch in cases]
    # the same model with the family's forward and a gate op of its own (no down projection GatedMLP can gate)
    monkeypatch.setattr(loader, "use_fused_blocks", lambda model, prims: 0)
    monkeypatch.setattr(fast_ops, "GGUFLinear", type("NotGating", (), {}))
    theirs = loader.load_gguf_model(path())
    assert _step_ops(theirs)["GKAddNorm"] == 0 and _step_ops(theirs)["GKGated"] == layers
    for (half, batch), apart_run in zip(cases, apart_steps, strict=True):
        for a, b, c in zip(_steps(ours, half, batch), apart_run, _steps(theirs, half, batch), strict=True):
            np.testing.assert_array_equal(a, c)
            np.testing.assert_array_equal(b, c)


@pytest.mark.slow
def test_qwen2_biases_ride_their_matmuls(ext: ModuleType) -> None:
    """Qwen 2's q/k/v biases are added by the projections' matmuls: no Add (and no Broadcast) of their own."""
    ops = _step_ops(loader.load_gguf_model(qwen_coder_path("0.5b")))
    assert ops["Add"] == 24 and ops["Broadcast"] <= 4  # the caches' offsets; the mask's broadcasts
