"""GGUF tensor data -> MLX arrays, for every ggml type common GGUFs use.

`mx.load` keeps only Q4_0/Q4_1/Q8_0 packed and rejects whole files holding Q5_0,
Q5_K, Q3_K or IQ4_XS, so we read raw blocks from a memmap ourselves (gguf's
GGUFReader is far too slow on big vocabularies) and produce either layout:

- "packed": MLX affine, group 32, fp16 scales/biases (what nn.QuantizedLinear takes).
- "dense": a plain `dense_dtype` matrix (fp32 by default: the CPU path runs BLAS sgemm).
- "native": 2-D quantized matrices stay GGUF blocks as stored, uint8 `(rows, row_bytes)`, for the
  CPU kernels (gmlx_server/engine/kernels); types they cannot read are requantized to Q8_0 blocks;
  float matrices go dense as in "dense".

Per-type choices for "packed". Error = max |packed - gguf dequant| / max |w| of the
tensor, measured on random valid blocks and on the Gemma-3 270M Q4_K_M file;
"noise" = rms of the added error / rms of the source's own rounding noise
(step/sqrt(12)); the requant bits keep that near 0.25, i.e. ~6% more noise power.

  type              becomes                       how                     max error
  Q4_0 Q4_1 Q8_0    affine q4/q4/q8 g32           exact block repack      0 (== mx.load's arrays)
  Q5_0 Q5_1         affine q5 g32                 exact block repack      0
  IQ4_NL            affine q8 g32                 int8 code book + 128    0
  Q4_K Q5_K         affine q4/q5 g32              exact but fp16 scales   4e-4 (Gemma Q4_K 7.6e-4)
  IQ4_XS Q8_K       affine q8 g32                 exact but fp16 scales   4e-4
  Q6_K              affine q8 g32 (requantized)   dequant + requant       3.7e-3 (Gemma 3.5e-3), noise 0.25
  Q3_K              affine q5 g32 (requantized)   dequant + requant       2.9e-2, noise 0.26 (q4: 0.54)
  Q2_K              affine q4 g32 (requantized)   dequant + requant       3.7e-2, noise 0.21
  IQ1/2/3_*, TQ*, MXFP4  affine q8 g32 (requantized)                      <= 3.9e-3
  F32/F16/BF16      dense f16 (2-D); 1-D F32 stays f32

Groups of 32 hold two of Q6_K/Q3_K/Q2_K's 16-element sub-blocks (two scales), and
MLX has no group 16, so those cannot be repacked exactly. "dense" is bit-identical
to gguf's dequantization for every type (Q8_K: within 1 fp32 ulp).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import gguf.quants
import mlx.core as mx
import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType

from gmlx_plan.gguf_header import GGML_TYPES, GGUFFormatError, TensorInfo, ggml_type_name
from gmlx_plan.memory import FLOAT_TYPES, PACKED_BITS, Layout
from gmlx_server.engine.kernels import NATIVE_TYPES, probe
from gmlx_server.engine.quant_repack import GROUP, REPACKERS, U8, Affine, pack_bits, quantize_affine

# Types with no exact affine form: dequantize with gguf, then requantize at the planner's bits (table above).
REQUANT_BITS: dict[str, int] = {name: bits for name, bits in PACKED_BITS.items() if name not in REPACKERS}
_FLOATS = {"F32": np.float32, "F16": np.float16, "F64": np.float64}
_DTYPE_NAMES = {mx.float32: "f32", mx.float16: "f16", mx.bfloat16: "bf16"}


class UnsupportedTensorType(ValueError):
    """A tensor's ggml type has no conversion to MLX here."""

    def __init__(self, name: str, ggml_type: int) -> None:
        super().__init__(f"tensor {name!r} has ggml type {ggml_type_name(ggml_type)} ({ggml_type}), "
                         "which gmlx cannot load")
        self.tensor_name, self.ggml_type = name, ggml_type


@dataclass(frozen=True)
class ConvertedTensor:
    arrays: dict[str, mx.array]  # {"weight"} dense, or {"weight", "scales", "biases"} MLX affine
    bits: int | None
    group_size: int | None
    source_type: str
    became: str
    native_type: int | None = None  # ggml type of the blocks in arrays["weight"] ("native" layout)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


def _mlx_shape(info: TensorInfo) -> tuple[int, ...]:
    """GGUF lists the fastest dimension first; MLX/PyTorch list it last."""
    return tuple(reversed(info.shape))


def _raw_bytes(mm: npt.NDArray[np.uint8], info: TensorInfo) -> U8:
    end = info.offset + info.nbytes
    if info.offset < 0 or end > mm.size:
        source = str(mm.filename) if isinstance(mm, np.memmap) and mm.filename else "<buffer>"
        raise GGUFFormatError(source, f"truncated: tensor {info.name} needs bytes up to {end}, "
                                      f"the file has {mm.size}")
    return np.asarray(mm[info.offset:end])


def _blocks(raw: U8, info: TensorInfo) -> U8:
    return raw.reshape(-1, GGML_TYPES[info.ggml_type][2])


def _dense_float(raw: U8, type_name: str) -> mx.array:
    """F32/F16/F64/BF16 bytes as an MLX array in their own dtype (F64 narrows to f32)."""
    if type_name == "BF16":
        return mx.array(raw.view(np.uint16)).view(mx.bfloat16)
    data = raw.view(_FLOATS[type_name])
    return mx.array(data.astype(np.float32) if type_name == "F64" else data)


def _affine_arrays(parts: Affine, shape: tuple[int, ...], bits: int,
                   scale_dtype: mx.Dtype) -> dict[str, mx.array]:
    """Blocks -> MLX {"weight", "scales", "biases"} shaped like `shape` (last dim packed)."""
    cols = shape[-1]
    q = parts.q.reshape(-1, cols)
    lead = shape[:-1]
    np_dtype = np.float16 if scale_dtype == mx.float16 else np.float32
    return {
        "weight": mx.array(pack_bits(q, bits).reshape(*lead, cols * bits // 32)),
        "scales": mx.array(parts.scales.astype(np_dtype).reshape(*lead, cols // GROUP)),
        "biases": mx.array(parts.biases.astype(np_dtype).reshape(*lead, cols // GROUP)),
    }


def _gguf_dequant(raw: U8, info: TensorInfo, type_name: str) -> npt.NDArray[np.float32]:
    """gguf's numpy dequantization, row by row, in MLX dimension order."""
    rows = raw.reshape(info.n_elements // info.shape[0], -1)
    out: npt.NDArray[np.float32] = gguf.quants.dequantize(rows, GGMLQuantizationType[type_name])
    return out.reshape(_mlx_shape(info))


def _expand_affine(parts: Affine, shape: tuple[int, ...]) -> mx.array:
    """scales * q + biases in fp32 on MLX: gguf's own arithmetic, faster than numpy or mx.dequantize."""
    q = mx.array(parts.q.reshape(-1, GROUP)).astype(mx.float32)
    w = q * mx.array(parts.scales.reshape(-1, 1)) + mx.array(parts.biases.reshape(-1, 1))
    return w.reshape(shape)


def _affine_parts(raw: U8, info: TensorInfo, type_name: str) -> tuple[int, Affine, bool]:
    """(bits, codes/scales/biases, requantized?) for a quantized tensor, exact where the blocks allow."""
    if type_name in REPACKERS:
        bits, unpack = REPACKERS[type_name]
        return bits, unpack(_blocks(raw, info)), False
    bits = REQUANT_BITS[type_name]
    dense = _gguf_dequant(raw, info, type_name)
    return bits, quantize_affine(dense.reshape(-1, dense.shape[-1]), bits), True


def _convert_dense(raw: U8, info: TensorInfo, type_name: str, dtype: mx.Dtype) -> mx.array:
    shape = _mlx_shape(info)
    if _is_float(type_name):
        return _dense_float(raw, type_name).reshape(shape).astype(dtype)
    if type_name in REPACKERS:
        _, parts, _ = _affine_parts(raw, info, type_name)
        return _expand_affine(parts, shape).astype(dtype)
    return mx.array(_gguf_dequant(raw, info, type_name)).astype(dtype)


def _dense_tensor(raw: U8, info: TensorInfo, type_name: str, dtype: mx.Dtype) -> ConvertedTensor:
    weight = _convert_dense(raw, info, type_name, dtype)
    became = f"dense {_DTYPE_NAMES.get(dtype, dtype)}"
    return ConvertedTensor({"weight": weight}, None, None, type_name, became)


def _packed_tensor(raw: U8, info: TensorInfo, type_name: str) -> ConvertedTensor:
    bits, parts, requantized = _affine_parts(raw, info, type_name)
    arrays = _affine_arrays(parts, _mlx_shape(info), bits, mx.float16)
    became = f"affine q{bits} g{GROUP}" + (" (requantized)" if requantized else "")
    return ConvertedTensor(arrays, bits, GROUP, type_name, became)


def _native_tensor(raw: U8, info: TensorInfo, type_name: str) -> ConvertedTensor:
    rows = info.n_elements // info.shape[0]
    if type_name in NATIVE_TYPES:
        blocks, became, native = raw.reshape(rows, -1), f"native {type_name} blocks", type_name
    else:  # no kernel reads it: Q8_0 keeps the requantization error well under the source's own
        dense = np.array(_convert_dense(raw, info, type_name, mx.float32)).reshape(rows, -1)  # covers Q8_K too
        blocks = gguf.quants.quantize(dense, GGMLQuantizationType.Q8_0)
        became, native = "native Q8_0 blocks (requantized)", "Q8_0"
    ext = probe().ext
    repacked = {} if ext is None else {"Q4_K": (ext.repack_q4k, ext.Q4_K_R), "Q5_K": (ext.repack_q5k, ext.Q5_K_R),
                                       "Q6_K": (ext.repack_q6k, ext.Q6_K_R)}
    if native in repacked:  # the int16 kernels' layouts: the same bytes, reordered (src/repack.h)
        repack, type_id = repacked[native]
        weight: mx.array = repack(np.ascontiguousarray(blocks))
        return ConvertedTensor({"weight": weight}, None, None, type_name, f"{became} (repacked)", type_id)
    return ConvertedTensor({"weight": mx.array(blocks)}, None, None, type_name, became, NATIVE_TYPES[native])


def _is_float(type_name: str) -> bool:
    return type_name in FLOAT_TYPES


def _dense_target(info: TensorInfo, type_name: str, layout: Layout, dense_dtype: mx.Dtype) -> mx.Dtype:
    """1-D F32 (norms, biases) stays f32 as mx.load keeps it; the rest takes the layout's dense dtype."""
    if len(info.shape) < 2 and type_name == "F32":
        return mx.float32
    return dense_dtype if layout == "dense" else mx.float16


def _check_supported(info: TensorInfo) -> str:
    name = ggml_type_name(info.ggml_type)
    if not _is_float(name) and name not in PACKED_BITS:
        raise UnsupportedTensorType(info.name, info.ggml_type)
    return name


def convert_tensor(mm: npt.NDArray[np.uint8], info: TensorInfo, layout: Layout,
                   dense_dtype: mx.Dtype = mx.float32) -> ConvertedTensor:
    """One tensor from the file's uint8 memmap, in MLX (PyTorch) dimension order."""
    type_name = _check_supported(info)
    raw = _raw_bytes(mm, info)
    if layout == "packed" and len(info.shape) >= 2 and not _is_float(type_name):
        return _packed_tensor(raw, info, type_name)
    if layout == "native" and len(info.shape) == 2 and not _is_float(type_name):
        return _native_tensor(raw, info, type_name)
    dense_layout: Layout = "packed" if layout == "packed" else "dense"
    return _dense_tensor(raw, info, type_name, _dense_target(info, type_name, dense_layout, dense_dtype))


@dataclass
class TypeLoad:
    count: int = 0
    nbytes: int = 0


@dataclass
class LoadReport:
    """What each GGUF tensor type became, for the load log and /v1/models."""

    by_type: dict[tuple[str, str], TypeLoad] = field(default_factory=dict)  # (source type, became) -> totals
    total_bytes: int = 0
    seconds: float = 0.0

    def add(self, t: ConvertedTensor) -> None:
        entry = self.by_type.setdefault((t.source_type, t.became), TypeLoad())
        entry.count += 1
        entry.nbytes += t.nbytes
        self.total_bytes += t.nbytes

    def lines(self) -> list[str]:
        out = [f"{src} x{e.count} -> {became} ({e.nbytes / 1e6:.1f} MB)"
               for (src, became), e in sorted(self.by_type.items())]
        out.append(f"total {self.total_bytes / 1e6:.1f} MB in {self.seconds:.2f} s")
        return out


def load_gguf_tensors(path: str | Path, infos: Sequence[TensorInfo], layout: Layout,
                      dense_dtype: mx.Dtype = mx.float32,
                      keep: Callable[[str], Layout | None] | None = None,
                      ) -> tuple[dict[str, ConvertedTensor], LoadReport]:
    """Convert every tensor in `infos`; `keep(name)` may override the layout per tensor."""
    start = time.perf_counter()
    for info in infos:
        _check_supported(info)  # fail before spending time on the rest of the file
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out: dict[str, ConvertedTensor] = {}
    report = LoadReport()
    for info in infos:
        chosen = (keep(info.name) if keep else None) or layout
        t = convert_tensor(mm, info, chosen, dense_dtype)
        mx.eval(*t.arrays.values())  # evaluate now: a lazy graph would keep the unpacked codes alive
        out[info.name] = t
        report.add(t)
    report.seconds = time.perf_counter() - start
    return out, report
