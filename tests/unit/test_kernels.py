"""The CPU kernels against float64 references on random GGUF blocks of every format they read.

Below 48 rows the kernels keep fp32 activations (weights decoded to fp32,
products summed in fp32), or round activations to int16 (scale max|x| / 32767 per 32, or per 256 for the K-quants,
round half to even) or to int8 per 32 as llama.cpp does (scale max|x| / 127) and sum codes times activations
exactly in integers; "auto" (the default) takes int16 up to a per-format row count and fp32 beyond. A rounded path
is checked tightly against a float64 product with the same rounded activations (only fp32 scaling and sums may
differ) and against the exact activations within the bound that rounding implies; the fp32 path, and from 48 rows
on dequantized panels of W through a preloaded sgemm (the suite preloads OpenBLAS), against the exact product; auto
within the int16 bound. From GEMM_ROWS (48) rows on, where the ISA has the int16 GEMM (AVX-512 VNNI, AVX-VNNI), the
repacked K-quants and the 32-element blocks take it in int16 and auto, with activations rounded to 16383 levels
(GEMM_FULL) so that its int32 lanes can sum longer runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import gguf
import mlx.core as mx
import numpy as np
import numpy.typing as npt
import pytest
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gmlx_server.config import read_env
from gmlx_server.engine.arch import make_cache
from gmlx_server.engine.kernels import NATIVE_TYPES
from gmlx_server.engine.loader import LoadedModel, load_gguf_model
from tests.conftest import smollm2_path

F64 = npt.NDArray[np.float64]
SGEMM_ROWS = 48  # from this many rows on the kernels use a preloaded BLAS's sgemm (dispatch.cpp)
# (activations, sgemm for many rows); levels of the rounding (0: none)
MODES = [("f32", False), ("int16", False), ("int8", False), ("auto", False), ("f32", True)]
LEVELS = {"int16": 32767, "int8": 127, "f32": 0, "auto": 32767}
KERNEL_TYPES = [*NATIVE_TYPES, "Q4_K_R", "Q5_K_R", "Q6_K_R"]  # the K-quants' blocks repacked at load (src/repack.h)
# fp16 field offsets (scale, min) and a scale range keeping |w| comparable across formats
FP16_FIELDS: dict[str, tuple[tuple[int, ...], float]] = {
    "Q4_0": ((0,), 0.1), "Q4_1": ((0, 2), 0.1), "Q5_0": ((0,), 0.1), "Q5_1": ((0, 2), 0.1), "Q8_0": ((0,), 0.01),
    "Q4_K": ((0, 2), 0.02), "Q5_K": ((0, 2), 0.02), "Q6_K": ((208,), 0.02),
}


@pytest.fixture(scope="module")
def every_isa(ext: ModuleType) -> Iterator[list[str]]:
    first = ext.isa()
    yield ext.isas()
    ext.set_isa(first)
    ext.set_threads(0)
    ext.set_sgemm(True)
    ext.set_activations("auto")


def random_blocks(rng: np.random.Generator, name: str, rows: int, k: int) -> npt.NDArray[np.uint8]:
    """Random bytes are valid blocks of every format once the fp16 scale fields hold finite values."""
    qk, size = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    blocks = rng.integers(0, 256, (rows, k // qk, size), dtype=np.uint8)
    offsets, scale = FP16_FIELDS[name]
    for off in offsets:
        vals = rng.uniform(-scale, scale, (rows, k // qk)).astype(np.float16)
        blocks[..., off:off + 2] = vals.view(np.uint8).reshape(rows, k // qk, 2)
    return blocks.reshape(rows, -1)


def ggml_type(name: str) -> GGMLQuantizationType:
    return GGMLQuantizationType[name.removesuffix("_R")]


def as_stored(ext: ModuleType, name: str, blocks: npt.NDArray[np.uint8]) -> tuple[mx.array, int]:
    """The blocks as the kernels read them, and their type id."""
    repacked = {"Q4_K_R": (ext.repack_q4k, ext.Q4_K_R), "Q5_K_R": (ext.repack_q5k, ext.Q5_K_R),
                "Q6_K_R": (ext.repack_q6k, ext.Q6_K_R)}
    if name in repacked:
        repack, type_id = repacked[name]
        return mx.array(repack(blocks)), type_id
    return mx.array(blocks), NATIVE_TYPES[name]


def quantized_activations(x: npt.NDArray[np.float32], levels: int, group: int) -> F64:
    """The kernels' activation rounding, in numpy's IEEE fp32 arithmetic (the same operations)."""
    xb = x.reshape(x.shape[0], -1, group)
    d = np.abs(xb).max(axis=-1, keepdims=True) / np.float32(levels)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    return (np.rint(xb * inv) * d).reshape(x.shape).astype(np.float64)


def check_matmul(ext: ModuleType, rng: np.random.Generator, name: str, n: int, blocks_per_row: int,
                 m: int, levels: int, exact_only: bool = False) -> None:
    """levels: the activations' rounding (0: none); exact_only: check only the bound against the exact
    activations (auto, which may take either path)."""
    qk = GGML_QUANT_SIZES[ggml_type(name)][0]
    group = qk if levels in (LEVELS["int16"], ext.GEMM_FULL) else 32  # int16 scales a K-quant's whole 256-block
    k = qk * blocks_per_row
    w_blocks = random_blocks(rng, ggml_type(name).name, n, k)
    w = gguf.quants.dequantize(w_blocks, ggml_type(name)).astype(np.float64)
    x = rng.standard_normal((m, k)).astype(np.float32) * rng.uniform(0.01, 10.0, (m, 1)).astype(np.float32)
    y = np.array(ext.matmul(mx.array(x), *as_stored(ext, name, w_blocks), k))
    assert y.shape == (m, n) and y.dtype == np.float32
    if not levels:  # fp32 activations (or sgemm): only fp32 sums differ
        ref = x.astype(np.float64) @ w.T
        np.testing.assert_array_less(np.abs(y - ref), 1e-5 * (np.abs(x) @ np.abs(w).T) + 1e-30)
        return
    xq = quantized_activations(x, levels, group)
    magnitude = np.abs(xq) @ np.abs(w).T
    if not exact_only:
        np.testing.assert_array_less(np.abs(y - xq @ w.T), 2e-6 * magnitude + 1e-30)
    # the activation rounding moves each x by at most half its group's step, max|x| / (2 * levels)
    step = np.repeat(np.abs(x.reshape(m, -1, group)).max(axis=-1) / (2.0 * levels), group, axis=1)
    bound = step @ np.abs(w).T * (1 + 1e-5) + 2e-6 * magnitude
    np.testing.assert_array_less(np.abs(y - x.astype(np.float64) @ w.T), bound + 1e-30)


def extreme_blocks(name: str, rows: int, k: int) -> npt.NDArray[np.uint8]:
    """Blocks whose every code times its sub-block scale is the format's largest product (d = 1, no mins):
    Q4_K 15 * 63, Q5_K 31 * 63, Q6_K (0 - 32) * -128, Q8_0 -128."""
    qk, size = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    blocks = np.full((rows, k // qk, size), 0xFF, dtype=np.uint8)
    one = np.frombuffer(np.float16(1.0).tobytes(), dtype=np.uint8)
    if name == "Q8_0":
        blocks[..., 2:] = 0x80  # int8 codes -128
        blocks[..., 0:2] = one
    elif name == "Q6_K":
        blocks[..., :192] = 0  # ql and qh: code 0, so -32
        blocks[..., 192:208] = 0x80  # int8 scales -128
        blocks[..., 208:210] = one
    else:
        blocks[..., 0:2] = one
        blocks[..., 2:4] = 0  # dmin
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K", "Q4_K_R", "Q5_K_R", "Q6_K_R", "Q8_0"])
def test_int16_sums_hold_the_largest_products(ext: ModuleType, every_isa: list[str], name: str) -> None:
    """Every activation at its int16 extreme (32767, or GEMM_FULL) against the largest code-times-scale products: a
    row's int32 lane sums stay below 2^31 on every ISA, one row, a tile of four and the many-row GEMM alike."""
    k, n = 512, 8
    blocks = extreme_blocks(ggml_type(name).name, n, k)
    w = gguf.quants.dequantize(blocks, ggml_type(name)).astype(np.float64)
    stored, type_id = as_stored(ext, name, blocks)
    ext.set_activations("int16")
    for isa in every_isa:
        ext.set_isa(isa)
        for m in (1, 2, 3, 4, 5, 8, 24, 48, 61):  # 48 on: the int16 GEMM where the ISA has it (its flush intervals)
            for sign in (1.0, -1.0):
                x = np.full((m, k), sign, dtype=np.float32)
                y = np.array(ext.matmul(mx.array(x), stored, type_id, k))
                np.testing.assert_allclose(y, x.astype(np.float64) @ w.T, rtol=1e-6)


@pytest.mark.parametrize("name", KERNEL_TYPES)
@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 40), blocks_per_row=st.integers(1, 3), m=st.integers(1, 112), threads=st.integers(1, 3),
       seed=st.integers(0, 2**32 - 1))
@example(n=7, blocks_per_row=3, m=1, threads=2, seed=1)  # one row: the K-quants' own one-row kernels
@example(n=5, blocks_per_row=2, m=2, threads=1, seed=2)
@example(n=33, blocks_per_row=20, m=50, threads=2, seed=3)  # the GEMM over spans, a 32-block format's last one short
def test_matmul_matches_float64_reference(ext: ModuleType, every_isa: list[str], name: str, n: int,
                                          blocks_per_row: int, m: int, threads: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ext.set_threads(threads)
    for isa in every_isa:
        ext.set_isa(isa)
        for mode, sgemm in MODES if ext.sgemm_available() else MODES[:-1]:
            ext.set_activations(mode)
            ext.set_sgemm(sgemm)
            check_matmul(ext, rng, name, n, blocks_per_row, m, expected_levels(ext, name, mode, sgemm, m),
                         exact_only=mode == "auto")


def expected_levels(ext: ModuleType, name: str, mode: str, sgemm: bool, m: int) -> int:
    """The activations' rounding the active ISA applies to m rows (0: none)."""
    gemm = name.endswith("_R") or GGML_QUANT_SIZES[ggml_type(name)][0] == 32  # gemm16.h's formats
    if m >= ext.GEMM_ROWS and gemm and mode in ("int16", "auto") and ext.int16_gemm():
        return int(ext.GEMM_FULL)
    return 0 if sgemm and m >= SGEMM_ROWS else LEVELS[mode]


@pytest.mark.parametrize("name", KERNEL_TYPES)
def test_dequantize_matches_gguf(ext: ModuleType, every_isa: list[str], name: str) -> None:
    rng = np.random.default_rng(7)
    qk = GGML_QUANT_SIZES[ggml_type(name)][0]
    blocks = random_blocks(rng, ggml_type(name).name, 9, 2 * qk)
    expected = gguf.quants.dequantize(blocks, ggml_type(name))
    for isa in every_isa:
        ext.set_isa(isa)
        got = np.array(ext.dequantize(*as_stored(ext, name, blocks), 2 * qk))
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0)  # fp32, one rounding apart at most


@pytest.mark.parametrize("name", ["Q4_1", "Q5_0", "Q4_K", "Q6_K"])
def test_concatenated_weights_are_more_output_rows(ext: ModuleType, name: str) -> None:
    """A fused projection (several matrices' rows stacked, odd counts) equals its parts side by side."""
    rng = np.random.default_rng(11)
    k = 2 * GGML_QUANT_SIZES[GGMLQuantizationType[name]][0]
    parts = [random_blocks(rng, name, n, k) for n in (7, 13, 29)]
    for m in (1, 3, 5, 17, 50):
        x = mx.array(rng.standard_normal((m, k)).astype(np.float32))
        whole = np.array(ext.matmul(x, mx.array(np.concatenate(parts)), NATIVE_TYPES[name], k))
        split = np.concatenate([np.array(ext.matmul(x, mx.array(p), NATIVE_TYPES[name], k)) for p in parts], axis=1)
        np.testing.assert_allclose(whole, split, rtol=1e-5, atol=1e-5 * float(np.abs(split).max()))


def test_strided_input_dtype_and_compile(ext: ModuleType) -> None:
    rng = np.random.default_rng(3)
    blocks = random_blocks(rng, "Q4_1", 24, 64)
    w = mx.array(blocks)
    xt = mx.array(rng.standard_normal((64, 5)).astype(np.float32)).T  # a transposed (strided) view
    base = np.array(ext.matmul(mx.array(np.ascontiguousarray(np.array(xt))), w, NATIVE_TYPES["Q4_1"], 64))
    np.testing.assert_array_equal(np.array(ext.matmul(xt, w, NATIVE_TYPES["Q4_1"], 64)), base)
    compiled = mx.compile(lambda a: ext.matmul(a, w, NATIVE_TYPES["Q4_1"], 64) * 2.0)
    np.testing.assert_array_equal(np.array(compiled(xt)), base * 2.0)
    half = ext.matmul(xt.astype(mx.float16), w, NATIVE_TYPES["Q4_1"], 64)
    assert half.dtype == mx.float16 and half.shape == (5, 24)


def test_bad_arguments_are_refused(ext: ModuleType) -> None:
    x = mx.zeros((1, 64))
    with pytest.raises(ValueError, match="no kernel for ggml type 10"):
        ext.matmul(x, mx.zeros((4, 42), dtype=mx.uint8), 10, 64)  # Q2_K
    with pytest.raises(ValueError, match="uint8 rows of 40 bytes"):
        ext.matmul(x, mx.zeros((4, 36), dtype=mx.uint8), NATIVE_TYPES["Q4_1"], 64)
    with pytest.raises(ValueError, match="last dimension must be k"):
        ext.matmul(mx.zeros((1, 32)), mx.zeros((4, 40), dtype=mx.uint8), NATIVE_TYPES["Q4_1"], 64)
    with pytest.raises(ValueError, match="not supported on this CPU"):
        ext.set_isa("no-such-isa")
    with pytest.raises(ValueError, match="auto, int16, int8 or f32"):
        ext.set_activations("int4")
    assert ext.row_bytes(NATIVE_TYPES["Q6_K"], 512) == 420 and ext.row_bytes(NATIVE_TYPES["Q4_K"], 640) == -1
    assert [ext.row_bytes(t, 512) for t in (ext.Q4_K_R, ext.Q5_K_R, ext.Q6_K_R)] == [288, 352, 420]
    with pytest.raises(ValueError, match="whole 144-byte Q4_K blocks"):
        ext.repack_q4k(np.zeros((2, 100), dtype=np.uint8))
    with pytest.raises(ValueError, match="whole 176-byte Q5_K blocks"):
        ext.repack_q5k(np.zeros((2, 144), dtype=np.uint8))
    with pytest.raises(ValueError, match="whole 210-byte Q6_K blocks"):
        ext.repack_q6k(np.zeros((2, 144), dtype=np.uint8))


def _greedy(lm: LoadedModel, prompt: list[int], steps: int) -> tuple[list[int], npt.NDArray[np.float32]]:
    cache = make_cache(lm.model)
    logits = lm.model(mx.array([prompt]), cache=cache).logits[0, -1]
    rows, ids = [np.array(logits)], []
    for _ in range(steps):
        ids.append(int(mx.argmax(logits).item()))
        logits = lm.model(mx.array([[ids[-1]]]), cache=cache).logits[0, -1]
        rows.append(np.array(logits))
    return ids, np.stack(rows)


@pytest.mark.slow
def test_native_layout_matches_dense_on_smollm2(ext: ModuleType) -> None:
    """auto on the CPU picks the native layout (about the file's bytes); native_kernels=False keeps dense."""
    path = smollm2_path()
    native = load_gguf_model(path)
    dense = load_gguf_model(path, native_kernels=False)
    assert (native.info.weights_layout, dense.info.weights_layout) == ("native", "dense")
    assert native.info.weights_bytes < 1.1 * Path(path).stat().st_size < dense.info.weights_bytes / 4
    prompt = native.tokenizer.encode("The capital of France is", add_special_tokens=True)
    ids_n, rows_n = _greedy(native, prompt, 12)
    ids_d, rows_d = _greedy(dense, prompt, 12)
    assert ids_n == ids_d
    assert float(np.abs(rows_n - rows_d).max()) < 0.05  # fp32 activations: only the sums' order differs


def test_env_switch_reaches_the_engine_config() -> None:
    assert read_env({"GMLX_NATIVE_KERNELS": "0"}).native_kernels is False
    assert read_env({}).native_kernels is True
