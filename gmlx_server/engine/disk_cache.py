"""The disk tier of the prompt cache (issue 33): prompt-cache Entries as safetensors files, written off-path.

A file holds one Entry's arrays (quantized layers stay packed) and a JSON header naming the model file's identity,
the KV layout and the tokens. The file name hashes all three, so a changed model or layout never matches an old file.
Writes go to a temporary name then rename, so several processes may share one directory; a file that does not load
(truncated, corrupt, foreign) is logged once, removed and treated as a miss.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import mlx.core as mx

from gmlx_server.engine.prompt_cache import Entry

log = logging.getLogger(__name__)
FORMAT = "gmlx-kv/1"
HEADER_BYTES = 1 << 20  # the GGUF header and metadata sit in the first MiB; hashing it catches a replaced file
QUEUE_DEPTH = 8  # snapshots waiting to be written; beyond it a write is dropped and counted, never waited for
SUFFIX = ".kv.safetensors"


def model_identity(path: str | Path) -> str:
    """Size, mtime and a hash of the file's header bytes: a rewritten model file gets a new identity."""
    st = os.stat(path)
    with open(path, "rb") as f:
        head = hashlib.sha256(f.read(HEADER_BYTES)).hexdigest()[:16]
    return f"{st.st_size}-{st.st_mtime_ns}-{head}"


def entry_name(identity: str, layout: str, tokens: Sequence[int]) -> str:
    h = hashlib.sha256(json.dumps([FORMAT, identity, layout, list(tokens)]).encode()).hexdigest()
    return h[:40] + SUFFIX


class DiskCache:
    """One model's disk tier in `root`, bounded to `max_bytes` across the directory (oldest files out first)."""

    def __init__(self, root: str | Path, max_bytes: int, identity: str, layout: str) -> None:
        self.root, self.max_bytes, self.identity, self.layout = Path(root), max_bytes, identity, layout
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # mkdir's mode is masked by the umask and ignored for an existing dir
        self.writes = self.dropped = self.hits = self.misses = self.removed_bad = 0
        self._queue: queue.Queue[Entry | None] = queue.Queue(QUEUE_DEPTH)
        self._thread = threading.Thread(target=self._drain, name="gmlx-disk-cache", daemon=True)
        self._thread.start()

    def path_for(self, tokens: Sequence[int]) -> Path:
        return self.root / entry_name(self.identity, self.layout, tokens)

    # --- writing (a background thread) -------------------------------------------------------

    def put(self, entry: Entry) -> bool:
        """Queue `entry` for writing; False (counted in `dropped`) when the writer is behind."""
        try:
            self._queue.put_nowait(entry)
        except queue.Full:
            self.dropped += 1
            return False
        return True

    def flush(self) -> None:
        """Wait until every queued write is on disk (tests, shutdown)."""
        self._queue.join()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _drain(self) -> None:
        while True:
            entry = self._queue.get()
            try:
                if entry is None:
                    return
                self._write(entry)
            except OSError as e:  # a full disk or a vanished dir costs the write, never the server
                log.warning("prompt cache: disk write failed: %s", e)
            finally:
                self._queue.task_done()

    def _write(self, entry: Entry) -> None:
        if entry.nbytes > self.max_bytes:
            self.dropped += 1
            return
        final = self.path_for(entry.tokens)
        arrays, header = _encode(entry, self.identity, self.layout)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.{threading.get_ident()}.tmp.safetensors")
        mx.save_safetensors(str(tmp), arrays, metadata={"gmlx": json.dumps(header)})
        os.replace(tmp, final)
        self.writes += 1
        self._evict()

    def _evict(self) -> None:
        """Remove the oldest files until the directory fits the cap (other processes' files count too)."""
        files = []
        for p in self.root.glob("*" + SUFFIX):
            try:
                st = p.stat()
            except FileNotFoundError:
                continue  # another process removed it meanwhile
            files.append((st.st_mtime_ns, st.st_size, p))
        total = sum(size for _, size, _ in files)
        for _, size, p in sorted(files):
            if total <= self.max_bytes:
                break
            p.unlink(missing_ok=True)
            total -= size

    # --- reading -----------------------------------------------------------------------------

    def load(self, tokens: Sequence[int]) -> Entry | None:
        """The stored Entry for exactly `tokens`, or None; a bad file is logged, removed and a miss."""
        path = self.path_for(tokens)
        if not path.exists():
            self.misses += 1
            return None
        try:
            arrays, meta = mx.load(str(path), return_metadata=True)
            if not isinstance(arrays, dict) or not isinstance(meta, dict):
                raise ValueError("not a safetensors file")
            entry = _decode(arrays, json.loads(str(meta["gmlx"])), self.identity, self.layout, tokens)
        except (OSError, ValueError, RuntimeError, KeyError, TypeError, IndexError) as e:
            log.warning("prompt cache: ignoring unreadable disk entry %s: %s", path.name, e)
            path.unlink(missing_ok=True)
            self.removed_bad += 1
            self.misses += 1
            return None
        os.utime(path)  # a hit makes it the newest: oldest-out is least recently used
        self.hits += 1
        return entry

    def load_longest(self, prompt: Sequence[int], lengths: Sequence[int]) -> Entry | None:
        """The longest stored prefix of `prompt` among the candidate `lengths` (its message boundaries)."""
        for n in sorted({n for n in lengths if 0 < n < len(prompt)}, reverse=True):
            if self.path_for(prompt[:n]).exists():
                entry = self.load(prompt[:n])
                if entry is not None:
                    return entry
        return None

    def clear(self) -> int:
        """Remove every entry file in the directory; the count removed."""
        n = 0
        for p in self.root.glob("*" + SUFFIX):
            p.unlink(missing_ok=True)
            n += 1
        return n

    def stats(self) -> dict[str, Any]:
        sizes = [p.stat().st_size for p in self.root.glob("*" + SUFFIX) if p.exists()]
        return {"dir": str(self.root), "max_bytes": self.max_bytes, "bytes": sum(sizes), "entries": len(sizes),
                "hits": self.hits, "misses": self.misses, "writes": self.writes, "writes_dropped": self.dropped,
                "removed_bad": self.removed_bad}


def _encode(entry: Entry, identity: str, layout: str) -> tuple[dict[str, mx.array], dict[str, Any]]:
    arrays = {f"{i}.{j}": a for i, (_, parts, _) in enumerate(entry.layers) for j, a in enumerate(parts)}
    header = {"format": FORMAT, "identity": identity, "layout": layout, "tokens": list(entry.tokens),
              "layers": [[kind, len(parts), list(meta)] for kind, parts, meta in entry.layers],
              "trimmable": entry.trimmable, "kind": entry.kind, "tail": entry.tail}
    return arrays, header


def _decode(arrays: dict[str, mx.array], header: dict[str, Any], identity: str, layout: str,
            tokens: Sequence[int]) -> Entry:
    want = (FORMAT, identity, layout, list(tokens))
    if (header["format"], header["identity"], header["layout"], header["tokens"]) != want:
        raise ValueError("header names another model, layout or prompt")
    layers = tuple((str(kind), tuple(arrays[f"{i}.{j}"] for j in range(int(count))), tuple(meta))
                   for i, (kind, count, meta) in enumerate(header["layers"]))
    nbytes = sum(a.nbytes for _, parts, _ in layers for a in parts)
    kind: Literal["prompt", "ckpt"] = "ckpt" if header["kind"] == "ckpt" else "prompt"
    return Entry(tuple(tokens), layers, nbytes, bool(header["trimmable"]), kind, header["tail"])
