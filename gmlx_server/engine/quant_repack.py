"""Repack GGUF quant blocks into MLX affine group-32 form without a float round trip.

Each unpacker takes raw blocks `(n_blocks, type_size)` uint8 and returns
`Affine(q, scales, biases)`: q `(n_blocks, block_elems)` uint8 codes and float32
scales/biases `(n_blocks, block_elems // 32)`, so that w = scales * q + biases
equals gguf's own dequantization (one fp32 rounding at most).
`pack_bits` then lays the codes out the way MLX expects: a little-endian bit
stream in uint32 words, element i at bits [i*b, (i+1)*b) (checked against
mx.quantize for b in 2, 3, 4, 5, 6, 8).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from gmlx_plan.memory import AFFINE_GROUP, PACKED_BITS

U8 = npt.NDArray[np.uint8]
F32 = npt.NDArray[np.float32]

GROUP = AFFINE_GROUP  # MLX affine group size used for every packed tensor (the planner's constant)
QK_K = 256  # k-quant super-block

# llama.cpp's non-linear 4-bit code book (IQ4_NL / IQ4_XS): int8 levels, so +128 makes an exact uint8 code.
IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                      dtype=np.int16)
_IQ4_CODES = (IQ4_LEVELS + 128).astype(np.uint8)


class Affine(NamedTuple):
    q: U8
    scales: F32
    biases: F32


def _f16(blocks: U8, start: int) -> F32:
    """An fp16 field at byte `start` of each block, as an (n, 1) float32 column."""
    return np.ascontiguousarray(blocks[:, start:start + 2]).view(np.float16).astype(np.float32)


def _nibbles_split(qs: U8) -> U8:
    """GGUF 32-element nibble layout: byte j holds element j (low) and j+16 (high)."""
    return np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=-1)


def _high_bits(qh: U8) -> U8:
    """Q5_0/Q5_1 `qh`: a little-endian uint32 whose bit i is bit 4 of element i."""
    return np.unpackbits(qh, axis=-1, bitorder="little") << np.uint8(4)


def unpack_q4_0(blocks: U8) -> Affine:
    d = _f16(blocks, 0)
    return Affine(_nibbles_split(blocks[:, 2:18]), d, -8.0 * d)  # w = d * (q - 8)


def unpack_q4_1(blocks: U8) -> Affine:
    return Affine(_nibbles_split(blocks[:, 4:20]), _f16(blocks, 0), _f16(blocks, 2))  # w = d * q + m


def unpack_q5_0(blocks: U8) -> Affine:
    d = _f16(blocks, 0)
    q = _nibbles_split(blocks[:, 6:22]) | _high_bits(blocks[:, 2:6])
    return Affine(q, d, -16.0 * d)  # w = d * (q - 16)


def unpack_q5_1(blocks: U8) -> Affine:
    q = _nibbles_split(blocks[:, 8:24]) | _high_bits(blocks[:, 4:8])
    return Affine(q, _f16(blocks, 0), _f16(blocks, 2))  # w = d * q + m


def unpack_q8_0(blocks: U8) -> Affine:
    d = _f16(blocks, 0)
    # int8 -> offset binary: flipping the sign bit adds 128.
    return Affine(blocks[:, 2:34] ^ np.uint8(0x80), d, -128.0 * d)


def unpack_q8_k(blocks: U8) -> Affine:
    d = np.ascontiguousarray(blocks[:, 0:4]).view(np.float32)
    d = np.repeat(d, QK_K // GROUP, axis=1)
    return Affine(blocks[:, 4:4 + QK_K] ^ np.uint8(0x80), d, -128.0 * d)


def _k_scale_min(packed: U8) -> tuple[U8, U8]:
    """The 8 six-bit (scale, min) pairs of a Q4_K/Q5_K super-block (12 packed bytes)."""
    d, m, md = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _k_affine(blocks: U8, q: U8) -> Affine:
    """Q4_K/Q5_K: sub-block s of 32 has w = d*sc[s]*q - dmin*mn[s], i.e. one affine group."""
    sc, mn = _k_scale_min(blocks[:, 4:16])
    return Affine(q, _f16(blocks, 0) * sc, -(_f16(blocks, 2) * mn))


def _k_nibbles(qs: U8) -> U8:
    """K-quant 4-bit layout: 32-byte chunk j holds sub-block 2j (low nibbles) and 2j+1 (high)."""
    n = qs.shape[0]
    chunks = qs.reshape(n, QK_K // 64, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (chunks & np.uint8(0x0F)).reshape(n, QK_K)


def unpack_q4_k(blocks: U8) -> Affine:
    return _k_affine(blocks, _k_nibbles(blocks[:, 16:144]))


def unpack_q5_k(blocks: U8) -> Affine:
    n = blocks.shape[0]
    qh = blocks[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    q = _k_nibbles(blocks[:, 48:176]) | ((qh & np.uint8(1)) << np.uint8(4)).reshape(n, QK_K)
    return _k_affine(blocks, q)


def unpack_iq4_nl(blocks: U8) -> Affine:
    d = _f16(blocks, 0)
    return Affine(_IQ4_CODES[_nibbles_split(blocks[:, 2:18])], d, -128.0 * d)  # w = d * level


def unpack_iq4_xs(blocks: U8) -> Affine:
    n = blocks.shape[0]
    scales_h = np.ascontiguousarray(blocks[:, 2:4]).view(np.uint16)  # (n, 1)
    lo = (blocks[:, 4:8].reshape(n, 4, 1) >> np.array([0, 4], dtype=np.uint8)).reshape(n, 8) & np.uint8(0x0F)
    hi = (scales_h >> np.arange(0, 16, 2, dtype=np.uint16)) & np.uint16(3)
    ls = (lo.astype(np.int16) | (hi.astype(np.int16) << 4)) - 32
    scale = _f16(blocks, 0) * ls.astype(np.float32)
    codes = _IQ4_CODES[_nibbles_split(blocks[:, 8:136].reshape(n, 8, 16))].reshape(n, QK_K)
    return Affine(codes, scale, -128.0 * scale)


_UNPACKERS: dict[str, Callable[[U8], Affine]] = {
    "Q4_0": unpack_q4_0, "Q4_1": unpack_q4_1, "Q5_0": unpack_q5_0, "Q5_1": unpack_q5_1, "Q8_0": unpack_q8_0,
    "Q8_K": unpack_q8_k, "Q4_K": unpack_q4_k, "Q5_K": unpack_q5_k, "IQ4_NL": unpack_iq4_nl, "IQ4_XS": unpack_iq4_xs,
}
# ggml type name -> (MLX bits, unpacker) for every type with an exact affine repack; the bits are the planner's
REPACKERS: dict[str, tuple[int, Callable[[U8], Affine]]] = {
    name: (PACKED_BITS[name], unpack) for name, unpack in _UNPACKERS.items()}


def pack_bits(q: U8, bits: int) -> npt.NDArray[np.uint32]:
    """Pack codes `(rows, cols)` (cols % 32 == 0) into MLX's uint32 layout `(rows, cols * bits // 32)`."""
    rows, cols = q.shape
    if bits == 8:
        packed = np.ascontiguousarray(q)
    elif bits == 4:
        packed = q[:, 0::2] | (q[:, 1::2] << np.uint8(4))
    else:
        # 8 codes of b bits fill exactly b bytes: build a uint64, keep its low b bytes (little-endian host).
        octets = q.reshape(rows, cols // 8, 8).astype(np.uint64) << (np.arange(8, dtype=np.uint64) * bits)
        words = np.bitwise_or.reduce(octets, axis=-1)
        packed = np.ascontiguousarray(words[..., None].view(np.uint8)[..., :bits])
    return packed.reshape(rows, cols * bits // 8).view(np.uint32)


def quantize_affine(w: F32, bits: int) -> Affine:
    """Min/max affine quantization of `(rows, cols)` floats in groups of 32, with fp16-exact scales.

    Unlike mx.quantize (which snaps zero onto the grid and so errs up to a full step),
    the error stays within half a step of each group's (max - min) / (2**bits - 1).
    """
    groups = w.reshape(-1, GROUP)
    lo, hi = groups.min(axis=1, keepdims=True), groups.max(axis=1, keepdims=True)
    # Round scale and bias to fp16 first and pick codes against them: fp16 storage then rounds nothing.
    scale = ((hi - lo) / (2**bits - 1)).astype(np.float16).astype(np.float32)
    bias = lo.astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scale > 0, np.rint((groups - bias) / scale), 0.0)
    codes = np.clip(q, 0, 2**bits - 1).astype(np.uint8).reshape(w.shape)
    rows = w.shape[0]
    return Affine(codes, scale.reshape(rows, -1), bias.reshape(rows, -1))
