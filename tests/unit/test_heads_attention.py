"""The fused heads primitive (GKHeads) and HeadsAttention: the same q, k and v as the separate slice, reshape,
transpose, norm, RoPE and cast ops, to the bit, and the same logits as the layers' own forward; fewer graph ops."""

from __future__ import annotations

import re
import tempfile
from types import ModuleType
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from mlx.utils import tree_flatten

from gmlx_server.engine import loader
from gmlx_server.engine.arch import make_cache
from gmlx_server.engine.batch import _as_batch
from gmlx_server.engine.kernels.heads import HeadsAttention
from gmlx_server.engine.kv_half import as_half
from tests.conftest import gemma_path, smollm2_path
from tests.unit.test_kernels import random_blocks

H, HK, D = 4, 2, 16


def _separate(ext: ModuleType, y: mx.array, cols: list[int], offset: Any, norms: tuple[Any, Any] | None,
              rope: dict[str, Any], half: bool) -> list[mx.array]:
    B, L, _ = y.shape
    parts = [y[..., c: c + n * D].reshape(B, L, n, D).transpose(0, 2, 1, 3)
             for c, n in zip(cols, (H, HK, HK), strict=True)]
    if norms is not None:
        parts[0], parts[1] = (ext.rms_norm(p, w, 1e-6) for p, w in zip(parts[:2], norms, strict=True))
    parts[0], parts[1] = (ext.rope(p, offset=offset, **rope) for p in parts[:2])
    return parts[:1] + [p.astype(mx.float16) if half else p for p in parts[1:]]


@pytest.mark.parametrize("case", range(6))
def test_heads_equal_the_separate_ops(ext: ModuleType, case: int) -> None:
    rng = np.random.default_rng(case)
    B, L = 1 + case % 2, (1, 5, 3)[case % 3]
    y = mx.array(rng.standard_normal((B, L, (H + 2 * HK) * D + 8)).astype(np.float32))
    cols = [8, 8 + H * D, 8 + (H + HK) * D] if case % 2 else [0, H * D, (H + HK) * D]
    offset: Any = mx.array([3, 40][:B], dtype=mx.int32) if B > 1 else 7 * case
    norms = (mx.array(rng.uniform(0.5, 2, D).astype(np.float32)),
             mx.array(rng.uniform(0.5, 2, D).astype(np.float32))) if case >= 3 else None
    freqs = mx.array(np.linspace(1, 90, D // 2, dtype=np.float32)) if case == 5 else None
    rope = {"dims": D if case != 4 else D // 2, "traditional": case == 1, "base": None if case == 5 else 1e4,
            "scale": 1.0 if case != 2 else 0.5, "freqs": freqs}
    got = ext.heads([y, y, y], cols, H, HK, D, offset=offset, q_norm=norms[0] if norms else None,
                    k_norm=norms[1] if norms else None, eps=1e-6, half_kv=case % 2 == 0, **rope)
    want = _separate(ext, y, cols, offset, norms, rope, case % 2 == 0)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(np.array(g.astype(mx.float32)), np.array(w.astype(mx.float32)))


@pytest.mark.parametrize("case", range(4))
def test_heads_of_a_projection_equal_its_matmul_then_heads(ext: ModuleType, case: int) -> None:
    """A fused q/k/v projection and its heads as one op: the matmul's product (and bias) then GKHeads, to the bit;
    decode rows, a few, and sgemm's."""
    rng = np.random.default_rng(case)
    name, k = (("Q8_0", 64), ("Q4_K", 256), ("Q4_1", 96), ("Q6_K", 256))[case]
    B, L = 1 + case % 2, (1, 3, 40, 1)[case]
    n = (H + 2 * HK) * D + 16 * (case % 2)
    blocks, qtype = mx.array(random_blocks(rng, name, n, k)), int(GGMLQuantizationType[name])
    x = mx.array(rng.standard_normal((B, L, k)).astype(np.float32))
    bias = mx.array(rng.standard_normal(n).astype(np.float32)) if case in (1, 2) else None
    cols = [16, 16 + H * D, 16 + (H + HK) * D] if case % 2 else [0, H * D, (H + HK) * D]
    norms = (mx.ones((D,)) * 1.5, mx.ones((D,)) * 0.5) if case == 3 else (None, None)
    rope = {"dims": D, "traditional": False, "base": 1e4, "scale": 1.0, "offset": 5 + case, "q_norm": norms[0],
            "k_norm": norms[1], "eps": 1e-6, "half_kv": case % 2 == 0}
    y = ext.matmul(x, blocks, qtype, k, bias=bias)
    want = ext.heads([y, y, y], cols, H, HK, D, **rope)
    got = ext.heads_of(x, blocks, qtype, k, bias, cols, H, HK, D, **rope)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(np.array(g.astype(mx.float32)), np.array(w.astype(mx.float32)))
    good = {key: v for key, v in rope.items() if key not in ("q_norm", "k_norm")}
    with pytest.raises(ValueError, match="past its source"):
        ext.heads_of(x, blocks, qtype, k, None, [0, H * D, n - HK * D + 1], H, HK, D, **good)
    with pytest.raises(ValueError, match="float32 x"):
        ext.heads_of(x.astype(mx.float16), blocks, qtype, k, None, cols, H, HK, D, **good)
    with pytest.raises(ValueError, match="last dimension must be k"):
        ext.heads_of(x[..., :-32], blocks, qtype, k, None, cols, H, HK, D, **good)


def test_heads_refuses_bad_arguments(ext: ModuleType) -> None:
    y = mx.zeros((1, 1, (H + 2 * HK) * D))
    good = {"dims": D, "traditional": False, "base": 1e4, "scale": 1.0, "offset": 0}
    with pytest.raises(ValueError, match="past its source"):
        ext.heads([y, y, y], [0, H * D, (H + HK) * D + 1], H, HK, D, **good)
    with pytest.raises(ValueError, match="float32"):
        ext.heads([y.astype(mx.float16)] * 3, [0, H * D, (H + HK) * D], H, HK, D, **good)
    with pytest.raises(ValueError, match="both norms"):
        ext.heads([y, y, y], [0, H * D, (H + HK) * D], H, HK, D, q_norm=mx.ones((D,)), **good)


@pytest.mark.parametrize("case", range(3))
def test_sdpa_reads_the_first_keys_of_a_buffer(ext: ModuleType, case: int) -> None:
    """keys=n attends to the first n rows of k and v, as the same call over the sliced rows does (a mask too)."""
    rng = np.random.default_rng(case)
    B, L, S, n = 2, (1, 3, 20)[case], 48, (5, 17, 40)[case]
    q = mx.array(rng.standard_normal((B, H, L, D)).astype(np.float32))
    k, v = (mx.array(rng.standard_normal((B, HK, S, D)).astype(np.float32)) for _ in range(2))
    mask = mx.array(rng.random((B, 1, L, n)) > 0.2) if case == 1 else None
    got = ext.sdpa(q, k, v, 0.125, mask, causal=case == 2, flat=True, keys=n)
    want = ext.sdpa(q, k[..., :n, :], v[..., :n, :], 0.125, mask, causal=case == 2, flat=True)
    np.testing.assert_array_equal(np.array(got), np.array(want))
    with pytest.raises(ValueError, match="keys past"):
        ext.sdpa(q, k, v, 0.125, None, causal=False, keys=S + 1)


def test_a_decode_step_writes_the_kv_buffers_in_place(ext: ModuleType) -> None:
    """SmolLM2's decode step appends each layer's keys and values with one SliceUpdate per buffer, which MLX
    donates: the cache's buffers keep their memory step after step (a copy of each whole buffer per step made
    decode at 2,000 tokens of context 1.4x slower), and attention reads them without a fetch Slice."""
    lm = loader.load_gguf_model(smollm2_path())
    cache = [_as_batch(c) for c in lm.make_cache()]
    mx.eval(lm.model(mx.array([list(range(1, 40))]), cache=cache).logits)
    with tempfile.NamedTemporaryFile("r", suffix=".dot") as f:
        mx.export_to_dot(f.name, lm.model(mx.array([[6]]), cache=cache).logits)
        ops = re.findall(r'label ="([A-Za-z]+)', f.read())
    layers = len(cache)
    assert ops.count("GKHeads") == layers and ops.count("SliceUpdate") == 2 * layers and "Slice" not in ops

    def where(a: mx.array) -> int:
        return int(np.asarray(a).__array_interface__["data"][0])

    mx.eval(lm.model(mx.array([[7]]), cache=cache).logits)
    before = [(where(c.keys), where(c.values)) for c in cache]
    for t in (8, 9):
        mx.eval(lm.model(mx.array([[t]]), cache=cache).logits)
        assert [(where(c.keys), where(c.values)) for c in cache] == before


def _steps(lm: loader.LoadedModel, half: bool, batch: bool) -> list[np.ndarray]:
    """A 560-token prompt in two chunks (past Gemma 3's 512-token sliding window), then three decode steps; every
    position's first 4,096 logits (a hidden state that moved moves them; Gemma's whole rows were 293 MB a chunk)."""
    cache = [as_half(c) for c in make_cache(lm.model)] if half else make_cache(lm.model)
    ids = [1 + i * 7 % 900 for i in range(560)]
    out = [np.array(lm.model(mx.array([ids[s: s + 280]]), cache=cache).logits[..., :4096]) for s in (0, 280)]
    if batch:
        cache = [_as_batch(c) for c in cache]
    for t in (9, 10, 11):
        out.append(np.array(lm.model(mx.array([[t]]), cache=cache).logits[..., :4096]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("path", [smollm2_path, gemma_path])
def test_heads_attention_keeps_the_logits(ext: ModuleType, path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ours = loader.load_gguf_model(path())
    monkeypatch.setattr(loader, "use_heads_attention", lambda model, prims: 0)
    theirs = loader.load_gguf_model(path())
    layers = len(ours.model.model.layers)
    assert sum(isinstance(m, HeadsAttention) for _, m in ours.model.named_modules()) == layers
    assert not any(isinstance(m, HeadsAttention) for _, m in theirs.model.named_modules())
    paths = [[k for k, _ in tree_flatten(lm.model.parameters())] for lm in (ours, theirs)]
    assert paths[0] == paths[1]  # the same parameter paths: the layer's children kept their names
    for half in (False, True):
        for batch in (False, True):
            for a, b in zip(_steps(ours, half, batch), _steps(theirs, half, batch), strict=True):
                np.testing.assert_array_equal(a, b)
    assert ours.kernels is not None
    ours.kernels.ext = None  # no primitives: each layer's own forward on MLX's ops
    got, want = _steps(ours, True, True), _steps(theirs, True, True)
    for g, w in zip(got, want, strict=True):  # MLX's attention, exp and norms: close, not to the bit
        assert float(np.abs(g - w).max()) < 2e-2 * max(1.0, float(np.abs(w).max()))


def test_layers_with_float_projections_keep_their_own_forward(ext: ModuleType) -> None:
    """A float matrix loads as a dense Linear (the thinking-model fixture's): no GGUF source for the heads op, so the
    layer is not swapped and the model runs as before."""
    from gmlx_server.engine.attention import use_gmlx_attention
    from gmlx_server.engine.kernels import fast_ops
    from gmlx_server.engine.kernels.heads import use_heads_attention
    from tests.unit.test_model_modules import CASES, _logits, _model

    model = _model(*CASES["qwen3"])
    prims = fast_ops.Primitives(ext)
    fast_ops.use_kernel_modules(model, prims)
    assert use_gmlx_attention(model, cpu=True, prims=prims) == 2
    want = _logits(model)
    assert use_heads_attention(model, prims) == 0
    assert mx.array_equal(_logits(model), want)
