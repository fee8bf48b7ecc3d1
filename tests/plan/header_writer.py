"""Write GGUF headers byte by byte (struct), with tensor infos but no tensor data: the file is
truncated to its full size, so it is sparse and costs no disk, yet its size matches the header.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gmlx_plan.gguf_header import GGML_TYPES

ALIGN = 32
_TYPE_IDS = {name: tid for tid, (name, _, _) in GGML_TYPES.items()}
_U32, _I32, _F32, _U64, _STR, _ARR, _BOOL = 4, 5, 6, 10, 8, 9, 7


def _str(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("<Q", len(raw)) + raw


def _value(v: Any) -> tuple[int, bytes]:
    if isinstance(v, bool):
        return _BOOL, struct.pack("<?", v)
    if isinstance(v, int):
        return (_U32, struct.pack("<I", v)) if 0 <= v < 1 << 32 else (_U64, struct.pack("<Q", v))
    if isinstance(v, float):
        return _F32, struct.pack("<f", v)
    if isinstance(v, str):
        return _STR, _str(v)
    if isinstance(v, list):
        if all(isinstance(x, str) for x in v):
            return _ARR, struct.pack("<IQ", _STR, len(v)) + b"".join(_str(x) for x in v)
        if all(isinstance(x, float) for x in v):
            return _ARR, struct.pack("<IQ", _F32, len(v)) + struct.pack(f"<{len(v)}f", *v)
        return _ARR, struct.pack("<IQ", _I32, len(v)) + struct.pack(f"<{len(v)}i", *v)
    raise TypeError(f"cannot write {type(v).__name__}")


def tensor_bytes(shape: Sequence[int], type_name: str) -> int:
    _, block, size = GGML_TYPES[_TYPE_IDS[type_name]]
    n = 1
    for d in shape:
        n *= d
    return n // block * size


def write_header(path: Path, metadata: Mapping[str, Any], tensors: Sequence[tuple[str, tuple[int, ...], str]]) -> int:
    """tensors: (name, GGUF shape (fastest dimension first), type name). Returns the file size."""
    out = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(metadata))]
    for key, v in metadata.items():
        vtype, raw = _value(v)
        out += [_str(key), struct.pack("<I", vtype), raw]
    offset = 0
    for name, shape, type_name in tensors:
        out += [_str(name), struct.pack("<I", len(shape)), struct.pack(f"<{len(shape)}Q", *shape),
                struct.pack("<IQ", _TYPE_IDS[type_name], offset)]
        offset += -(-tensor_bytes(shape, type_name) // ALIGN) * ALIGN
    head = b"".join(out)
    data_start = -(-len(head) // ALIGN) * ALIGN
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(data_start + offset)  # sparse: the data region is never written
    return data_start + offset


def llama_tensors(layers: int, hidden: int, ffn: int, kv_dim: int, vocab: int,
                  quant: str = "Q4_K", sensitive: str = "Q6_K") -> list[tuple[str, tuple[int, ...], str]]:
    """A llama-family tensor list with realistic shapes and Q4_K_M-like types."""
    out: list[tuple[str, tuple[int, ...], str]] = [
        ("token_embd.weight", (hidden, vocab), quant), ("output_norm.weight", (hidden,), "F32"),
        ("output.weight", (hidden, vocab), sensitive)]
    for i in range(layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (hidden,), "F32"), (b + "ffn_norm.weight", (hidden,), "F32"),
                (b + "attn_q.weight", (hidden, hidden), quant), (b + "attn_k.weight", (hidden, kv_dim), quant),
                (b + "attn_v.weight", (hidden, kv_dim), sensitive), (b + "attn_output.weight", (hidden, hidden), quant),
                (b + "ffn_gate.weight", (hidden, ffn), quant), (b + "ffn_up.weight", (hidden, ffn), quant),
                (b + "ffn_down.weight", (ffn, hidden), sensitive)]
    return out
