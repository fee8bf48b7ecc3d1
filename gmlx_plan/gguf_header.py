"""A fast, dependency-free GGUF header reader: metadata and tensor infos, no tensor data.

gguf's GGUFReader builds numpy views for every array element and takes ~20 s on a
262k-token vocabulary; this reads the same header in a fraction of a second, which
the planner (30 GB files "in well under a second") and the engine both need. What it reads into
(GGUFHeader, TensorInfo, the ggml type table) is gguf_types.py, which opens no file.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

from gmlx_plan.gguf_types import GGML_TYPES as GGML_TYPES
from gmlx_plan.gguf_types import GGUFFormatError as GGUFFormatError
from gmlx_plan.gguf_types import GGUFHeader as GGUFHeader
from gmlx_plan.gguf_types import SkippedArray as SkippedArray
from gmlx_plan.gguf_types import TensorInfo as TensorInfo
from gmlx_plan.gguf_types import ggml_type_name as ggml_type_name
from gmlx_plan.gguf_types import tensor_nbytes as tensor_nbytes

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF value types (gguf spec): id -> struct format for scalars.
_SCALARS: dict[int, str] = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                            12: "<d"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes, path: str, keep_strings: bool = True) -> None:
        self.buf, self.pos, self.path, self.keep_strings = buf, 0, path, keep_strings

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise GGUFFormatError(self.path, f"truncated header (needs byte {end}, file has {len(self.buf)})")
        out = self.buf[self.pos:end]
        self.pos = end
        return bytes(out)

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        return self.take(n).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.array()
        raise GGUFFormatError(self.path, f"unknown metadata value type {vtype} at byte {self.pos}")

    def array(self) -> list[Any] | SkippedArray:
        etype, count = self.scalar("<I"), self.scalar("<Q")
        if etype in _SCALARS:
            fmt = _SCALARS[etype]
            size = struct.calcsize(fmt)
            raw = self.take(size * count)
            return list(struct.unpack(f"<{count}{fmt[1]}", raw))
        if etype == _STRING:
            return self.strings(count)
        return [self.value(etype) for _ in range(count)]

    def strings(self, count: int) -> list[str] | SkippedArray:
        """A string array in one tight loop: vocabularies hold 100k+ entries (several times faster than string())."""
        buf, pos, end = self.buf, self.pos, len(self.buf)
        unpack, out = _U64.unpack_from, list[str]()
        append = out.append
        try:
            if not self.keep_strings:  # the planner needs only lengths to step over a vocabulary
                for _ in range(count):
                    pos += 8 + unpack(buf, pos)[0]
            else:
                for _ in range(count):
                    n = unpack(buf, pos)[0]
                    pos += 8
                    append(bytes(buf[pos:pos + n]).decode("utf-8", errors="replace"))
                    pos += n
        except struct.error:
            pos = end + 1
        if pos > end:
            raise GGUFFormatError(self.path, f"truncated header (a string array runs past byte {end})")
        self.pos = pos
        return out if self.keep_strings else SkippedArray(count)


def read_header(path: str | Path, *, strings: bool = True) -> GGUFHeader:
    """Parse metadata and tensor infos; raise GGUFFormatError naming the file on any defect.

    strings=False steps over string arrays (the vocabulary, merges), leaving a SkippedArray with their
    length: what the capacity planner needs, in a fraction of the time.
    """
    p = str(path)
    try:
        with open(p, "rb") as f:
            size = Path(p).stat().st_size
            if size < 24:
                raise GGUFFormatError(p, f"not a GGUF file (only {size} bytes)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                return _parse(_Cursor(mm, p, strings), p, size)
    except OSError as e:
        raise GGUFFormatError(p, f"cannot read: {e.strerror or e}") from e


def _parse(cur: _Cursor, path: str, size: int) -> GGUFHeader:
    magic = cur.take(4)
    if magic != GGUF_MAGIC:
        raise GGUFFormatError(path, f"not a GGUF file (bad magic: it starts with {magic!r}, not {GGUF_MAGIC!r})")
    version = cur.scalar("<I")
    if version not in (2, 3):
        raise GGUFFormatError(path, f"unsupported GGUF version {version}")
    n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
    if n_tensors > 1_000_000 or n_kv > 1_000_000:
        raise GGUFFormatError(path, "corrupt header (implausible tensor or key count)")
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        meta[key] = cur.value(cur.scalar("<I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        ndim = cur.scalar("<I")
        shape = tuple(cur.scalar("<Q") for _ in range(ndim))
        ggml_type, rel = cur.scalar("<I"), cur.scalar("<Q")
        infos.append((name, shape, ggml_type, rel))
    align = int(meta.get("general.alignment", DEFAULT_ALIGNMENT))
    data_offset = (cur.pos + align - 1) // align * align
    tensors = []
    for name, shape, ggml_type, rel in infos:
        nbytes = tensor_nbytes(shape, ggml_type, path)
        start = data_offset + rel
        if start + nbytes > size:
            raise GGUFFormatError(path, f"truncated: tensor {name} ends at byte {start + nbytes}, file has {size}")
        tensors.append(TensorInfo(name, shape, ggml_type, start, nbytes))
    return GGUFHeader(path, version, meta, tuple(tensors), data_offset, size)


def token_list_difference(a: GGUFHeader, b: GGUFHeader) -> str | None:
    """None when both files carry the same token list (what a drafter must share with its target); else
    where they first differ, naming both files. Needs headers read with their strings."""
    ta, tb = a.metadata.get("tokenizer.ggml.tokens"), b.metadata.get("tokenizer.ggml.tokens")
    if not isinstance(ta, list) or not isinstance(tb, list):
        missing = a.path if not isinstance(ta, list) else b.path
        return f"{missing} carries no token list (tokenizer.ggml.tokens)"
    if ta == tb:
        return None
    if len(ta) != len(tb):
        return f"{a.path} has {len(ta)} tokens, {b.path} has {len(tb)}"
    i = next(i for i, (x, y) in enumerate(zip(ta, tb, strict=True)) if x != y)
    return f"token {i} is {ta[i]!r} in {a.path} but {tb[i]!r} in {b.path}"
