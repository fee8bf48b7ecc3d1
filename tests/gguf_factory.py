"""Write tiny GGUF files for tests with gguf's own GGUFWriter (the writer llama.cpp's converter uses).

Weights are given in HF/PyTorch order (rows, cols); GGUFWriter stores the reversed
GGUF shape. Quantized tensors are raw block bytes `(rows, cols // block * type_size)`:
from `quantize` (types gguf can quantize) or `random_blocks` (any type gguf can
dequantize: random codes and sub-scales, finite small super-block scales).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import gguf.quants
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES

# Types gguf.quants can quantize from floats (F32/F16 are plain casts).
QUANTIZABLE = (QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.TQ1_0, QT.TQ2_0,
               QT.MXFP4)

# Byte offsets of the fp16 (super-)block scales: random bytes there could be inf/NaN or huge.
_F16_FIELDS: dict[QT, tuple[int, ...]] = {
    QT.Q4_0: (0,), QT.Q4_1: (0, 2), QT.Q5_0: (0,), QT.Q5_1: (0, 2), QT.Q8_0: (0,), QT.Q2_K: (80, 82),
    QT.Q3_K: (108,), QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,), QT.IQ4_NL: (0,), QT.IQ4_XS: (0,),
    QT.IQ2_XXS: (0,), QT.IQ2_XS: (0,), QT.IQ2_S: (0,), QT.IQ3_XXS: (0,), QT.IQ3_S: (0,), QT.IQ1_S: (0,),
    QT.TQ1_0: (52,), QT.TQ2_0: (64,),
}


@dataclass(frozen=True)
class FakeTensor:
    name: str
    data: np.ndarray  # float array (F32/F16/I32 written as-is) or raw uint8 block bytes
    qtype: QT


def quantize(weights: np.ndarray, qtype: QT) -> np.ndarray:
    """gguf's own quantizer: raw uint8 blocks for quantized types, a float array for F32/F16."""
    return gguf.quants.quantize(np.asarray(weights, dtype=np.float32), qtype)


def random_blocks(qtype: QT, shape: tuple[int, int], rng: np.random.Generator,
                  scale: float = 1e-2) -> np.ndarray:
    """Valid random blocks for a (rows, cols) tensor: random codes, super-block scales near `scale`."""
    block, size = GGML_QUANT_SIZES[qtype]
    rows, cols = shape
    raw = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    def scales(dtype: type[np.floating[Any]]) -> np.ndarray:
        return (rng.uniform(0.5, 2.0, size=(raw.shape[0], 1)) * scale).astype(dtype).view(np.uint8)

    for off in _F16_FIELDS.get(qtype, ()):
        raw[:, off:off + 2] = scales(np.float16)
    if qtype == QT.Q8_K:
        raw[:, 0:4] = scales(np.float32)  # Q8_K's d is an fp32
    elif qtype == QT.MXFP4:
        raw[:, 0] = rng.integers(118, 124, size=raw.shape[0])  # E8M0 exponents near 2**-7
    elif qtype == QT.IQ1_M:
        raw[:, 55] = (raw[:, 55] & 0x0F) | 0x10  # the fp16 scale's sign/exponent nibble lives here
    return raw.reshape(rows, -1)


def reference(raw: np.ndarray, qtype: QT) -> np.ndarray:
    """float32 weights as llama.cpp sees them (gguf's numpy dequantization; Q8_K by hand)."""
    if qtype == QT.Q8_K:
        blocks = raw.reshape(-1, GGML_QUANT_SIZES[qtype][1])
        d = blocks[:, 0:4].copy().view(np.float32)
        out = d * blocks[:, 4:260].view(np.int8).astype(np.float32)
        return out.reshape(raw.shape[0], -1)
    if qtype in (QT.F32, QT.F16):
        return np.asarray(raw, dtype=np.float32)
    return gguf.quants.dequantize(raw, qtype)


def _add_metadata(writer: gguf.GGUFWriter, metadata: Mapping[str, Any]) -> None:
    for key, val in metadata.items():
        if isinstance(val, bool):
            writer.add_bool(key, val)
        elif isinstance(val, int) and val >= 0:
            writer.add_uint32(key, val)
        elif isinstance(val, int):
            writer.add_int32(key, val)
        elif isinstance(val, float):
            writer.add_float32(key, val)
        elif isinstance(val, str):
            writer.add_string(key, val)
        else:
            writer.add_array(key, list(val))


def write_gguf(path: str | Path, tensors: Sequence[FakeTensor], arch: str = "llama",
               metadata: Mapping[str, Any] | None = None) -> Path:
    """Write `tensors` (and optional metadata) to `path`; return the path."""
    writer = gguf.GGUFWriter(str(path), arch)
    _add_metadata(writer, metadata or {})
    for t in tensors:
        raw_dtype = t.qtype if t.data.dtype == np.uint8 else None
        writer.add_tensor(t.name, t.data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
