"""The disk tier's file format: one prompt-cache Entry per safetensors file, with a JSON header.

The arrays are the Entry's layers as kv_snapshot.py copies them (quantized layers stay packed). The header,
in the safetensors metadata under "gmlx", names the model (its id and its file's identity), the KV layout and
the tokens, so a file can be matched, and its owner found, from the header alone without loading an array.
Directory-wide helpers (usage, clearing) serve the routes, which see the directory and no engine. No MLX here
(the app imports it): the arrays are read and written in disk_cache.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gmlx_server.engine.prompt_cache import common_prefix

FORMAT = "gmlx-kv/1"
HEADER_BYTES = 1 << 20  # the GGUF header and metadata sit in the first MiB; hashing it catches a replaced file
SUFFIX = ".kv.safetensors"
MAX_JSON = 64 << 20  # a safetensors header larger than this is not one of ours


class BadFile(ValueError):
    """A file in the directory that is not a readable entry (truncated, corrupt, another program's)."""


@dataclass(frozen=True)
class Stored:
    """One entry file as its header describes it: what the index matches prompts against."""

    path: Path
    model: str
    identity: str
    layout: str
    tokens: tuple[int, ...]
    trimmable: bool
    pinned: bool
    size: int  # the file's bytes: what a restore reads


def kv_layout(kv_quant: object, weights: str, max_kv_size: int | None, mmproj: str | None,
              native_kernels: bool, kv_dtype: str = "float32") -> str:
    """All that shapes a model's KV besides its file: an entry written under other settings never matches (a
    float16 cache's arrays are not a float32 one's). kv_dtype float32 keys as before it existed."""
    key: tuple[object, ...] = (kv_quant, weights, max_kv_size, mmproj, native_kernels)
    return repr(key if kv_dtype == "float32" else (*key, kv_dtype))


def usable(stored: Stored, prompt: Sequence[int]) -> int:
    """Prompt tokens `stored` can restore, by the RAM tier's rules: a trimmable entry up to the common prefix,
    any other only whole; always one prompt token short (it yields the logits)."""
    limit, n = len(prompt) - 1, len(stored.tokens)
    if stored.trimmable:
        return min(common_prefix(stored.tokens, prompt), limit)
    return n if n <= limit and tuple(prompt[:n]) == stored.tokens else 0


def peek(root: Path, model: str, identity: str, layout: str, prompt: Sequence[int]) -> int:
    """The prompt tokens the directory could restore for a model that is not loaded (its estimate); no writes."""
    best = 0
    for path in entry_files(root):
        try:
            stored = read_header(path)
        except (BadFile, FileNotFoundError):
            continue  # the engine removes bad files when it meets them
        if (stored.model, stored.identity, stored.layout) == (model, identity, layout):
            best = max(best, usable(stored, prompt))
    return best


def model_identity(path: str | Path) -> str:
    """Size, mtime and a hash of the header bytes (of config.json for a model directory): a rewritten model
    file gets a new identity, so its old entries never match."""
    p = Path(path)
    files = sorted(f for f in p.iterdir() if f.is_file()) if p.is_dir() else [p]
    head_file = p / "config.json" if p.is_dir() else p
    with open(head_file, "rb") as f:
        head = hashlib.sha256(f.read(HEADER_BYTES)).hexdigest()[:16]
    stamps = "-".join(f"{st.st_size}.{st.st_mtime_ns}" for st in (f.stat() for f in files))
    return f"{hashlib.sha256(stamps.encode()).hexdigest()[:16]}-{head}"


def entry_name(identity: str, layout: str, tokens: Sequence[int]) -> str:
    h = hashlib.sha256(json.dumps([FORMAT, identity, layout, list(tokens)]).encode()).hexdigest()
    return h[:40] + SUFFIX


def entry_files(root: Path) -> list[Path]:
    """The entry files in `root` (temporary files of writes in progress are dot-names and not listed)."""
    try:
        return [Path(e.path) for e in os.scandir(root) if e.name.endswith(SUFFIX) and not e.name.startswith(".")]
    except FileNotFoundError:
        return []


def read_header(path: Path) -> Stored:
    """The header of an entry file without loading its arrays; BadFile when it is not one."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > MAX_JSON:
                raise BadFile("header too large")
            head = json.loads(f.read(n))
        size = path.stat().st_size
        meta = json.loads(head["__metadata__"]["gmlx"])
        if meta["format"] != FORMAT:
            raise BadFile(f"format {meta['format']!r}")
        if path.name != entry_name(meta["identity"], meta["layout"], meta["tokens"]):
            raise BadFile("its name does not match its header")  # copied or renamed: not this key's file
        return Stored(path, str(meta["model"]), str(meta["identity"]), str(meta["layout"]),
                      tuple(int(t) for t in meta["tokens"]), bool(meta["trimmable"]), bool(meta["pinned"]), size)
    except (OSError, struct.error, ValueError, KeyError, TypeError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise BadFile(str(e) or type(e).__name__) from e


def usage(root: Path) -> dict[str, Any]:
    """The directory's entry files and bytes, every model's together (the cap is the directory's)."""
    sizes = []
    for p in entry_files(root):
        try:
            sizes.append(p.stat().st_size)
        except FileNotFoundError:
            continue
    return {"entries": len(sizes), "bytes": sum(sizes)}


def clear(root: Path, model: str | None = None) -> int:
    """Remove every entry file, or those of one model id (read from each header); the count removed."""
    n = 0
    for p in entry_files(root):
        if model is not None:
            try:
                if read_header(p).model != model:
                    continue
            except BadFile:
                pass  # unreadable: removing it is a cleanup, whichever model it was
            except FileNotFoundError:
                continue
        p.unlink(missing_ok=True)
        n += 1
    return n


def evict(root: Path, max_bytes: int) -> int:
    """Remove the least recently used files until the directory fits the cap; the count removed."""
    files = []
    for p in entry_files(root):
        try:
            st = p.stat()
        except FileNotFoundError:
            continue  # another process removed it meanwhile
        files.append((st.st_mtime_ns, st.st_size, p))
    total, n = sum(size for _, size, _ in files), 0
    for _, size, p in sorted(files):
        if total <= max_bytes:
            break
        p.unlink(missing_ok=True)
        total, n = total - size, n + 1
    return n
