"""The disk tier of the prompt cache: one model's Entries in a shared directory, written off the request path.

A background thread writes what the RAM tier stores (engine/disk_files.py holds the format); a full queue drops
the write and counts it, never waits. Lookups match the prompt against an index of the directory's headers by
the RAM tier's prefix rules, so a session's snapshots come back after a restart, an unload or a reload, and
files other processes wrote (several hosts may share the directory) are found too. A file that does not load
is logged once, removed and a miss, never an error.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import statistics
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import mlx.core as mx

from gmlx_server.engine.disk_files import (
    FORMAT,
    BadFile,
    Stored,
    entry_files,
    entry_name,
    evict,
    read_header,
    usable,
)
from gmlx_server.engine.prompt_cache import Entry

log = logging.getLogger(__name__)
QUEUE_DEPTH = 8  # snapshots waiting to be written; beyond it a write is dropped and counted, never waited for
READ_WINDOW = 16  # recent restores the read pace is the median of


@dataclass(frozen=True)
class DiskHit:
    stored: Stored
    tokens: int  # leading prompt tokens the file restores


def _write_entry(path: Path, entry: Entry, model: str, identity: str, layout: str) -> None:
    """Write to a temporary name, then rename: a reader (another process too) sees a whole file or none."""
    arrays = {f"{i}.{j}": a for i, (_, parts, _) in enumerate(entry.layers) for j, a in enumerate(parts)}
    header = {"format": FORMAT, "model": model, "identity": identity, "layout": layout,
              "tokens": list(entry.tokens), "layers": [[kind, len(parts), list(meta)]
                                                      for kind, parts, meta in entry.layers],
              "trimmable": entry.trimmable, "pinned": entry.pinned, "kind": entry.kind, "tail": entry.tail}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{id(entry)}.tmp.safetensors")
    try:
        mx.save_safetensors(str(tmp), arrays, metadata={"gmlx": json.dumps(header)})
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _read_entry(stored: Stored) -> Entry:
    """The Entry a file holds; BadFile when its arrays do not match its header."""
    try:
        arrays, meta = mx.load(str(stored.path), return_metadata=True)
        if not isinstance(arrays, dict) or not isinstance(meta, dict):
            raise BadFile("not a safetensors file")
        header = json.loads(str(meta["gmlx"]))
        layers = tuple((str(kind), tuple(arrays[f"{i}.{j}"] for j in range(int(count))), tuple(m))
                       for i, (kind, count, m) in enumerate(header["layers"]))
    except (OSError, ValueError, RuntimeError, KeyError, TypeError, IndexError) as e:
        raise BadFile(str(e) or type(e).__name__) from e
    if tuple(header["tokens"]) != stored.tokens:
        raise BadFile("header changed while reading")
    nbytes = sum(a.nbytes for _, parts, _ in layers for a in parts)
    kind: Literal["prompt", "ckpt"] = "ckpt" if header["kind"] == "ckpt" else "prompt"
    return Entry(stored.tokens, layers, nbytes, stored.trimmable, kind, header["tail"], stored.pinned)



class DiskCache:
    """One model's disk tier in `root`, which its `max_bytes` bounds as a whole (oldest files out first)."""

    def __init__(self, root: str | Path, max_bytes: int, model: str, identity: str, layout: str) -> None:
        self.root, self.max_bytes = Path(root), max_bytes
        self.model, self.identity, self.layout = model, identity, layout
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # mkdir's mode is masked by the umask and ignored for an existing dir
        self.writes = self.dropped = self.hits = self.misses = self.removed_bad = self.skipped = 0
        self.restored_tokens, self.restore_s, self.read_bytes = 0, 0.0, 0
        self._reads: deque[float] = deque(maxlen=READ_WINDOW)  # bytes a second of recent restores
        self._index: dict[Path, tuple[int, Stored | None]] = {}  # file -> (mtime, header; None: another's)
        self._lock = threading.Lock()  # the index: the engine thread looks up, the writer adds
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

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is on disk (shutdown, tests); False when `timeout` ran out first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Finish the queued writes (up to `timeout`), then stop the writer."""
        self.flush(timeout)
        try:
            self._queue.put(None, timeout=1.0)
        except queue.Full:
            return  # the writer is stuck on a slow disk: it is a daemon thread, the process may exit
        self._thread.join(timeout)

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
        path = self.path_for(entry.tokens)
        if path.exists():  # restored from disk, or written by another process: it only becomes the newest
            os.utime(path)
            return
        _write_entry(path, entry, self.model, self.identity, self.layout)
        self.writes += 1
        stored = Stored(path, self.model, self.identity, self.layout, entry.tokens, entry.trimmable,
                        entry.pinned, path.stat().st_size)
        with self._lock:
            self._index[path] = (path.stat().st_mtime_ns, stored)
        self._drop_covered(stored)
        evict(self.root, self.max_bytes)

    def _drop_covered(self, new: Stored) -> None:
        """A trimmable entry restores any prefix of itself: this model's older unpinned ones it extends go."""
        if not new.trimmable:
            return
        with self._lock:
            old = [s for _, s in self._index.values()
                   if s is not None and s.trimmable and not s.pinned and len(s.tokens) < len(new.tokens)
                   and new.tokens[: len(s.tokens)] == s.tokens]
        for s in old:
            s.path.unlink(missing_ok=True)

    # --- reading (the engine thread) ---------------------------------------------------------

    def best(self, prompt: Sequence[int], than: int = 0) -> DiskHit | None:
        """The stored entry restoring the most of `prompt`, if it restores more than `than` tokens."""
        best: DiskHit | None = None
        for stored in self._refresh():
            use = usable(stored, prompt)
            if use > max(than, best.tokens if best is not None else 0):
                best = DiskHit(stored, use)
        return best

    def read_seconds(self, hit: DiskHit) -> float | None:
        """What reading `hit` should take at the recent restores' pace; None before the first restore."""
        return hit.stored.size / statistics.median(self._reads) if self._reads else None

    def load(self, hit: DiskHit) -> Entry | None:
        """The Entry `hit` names, its read timed; a file that does not load is removed and a miss."""
        t0 = time.perf_counter()
        try:
            entry = _read_entry(hit.stored)
        except (BadFile, FileNotFoundError) as e:
            self._bad(hit.stored.path, e)
            self.misses += 1
            return None
        self.read_bytes += hit.stored.size
        self._reads.append(hit.stored.size / max(time.perf_counter() - t0, 1e-6))
        os.utime(hit.stored.path)  # a hit makes it the newest: oldest-out is least recently used
        return entry

    def restored(self, tokens: int, seconds: float) -> None:
        """A disk hit's restore finished (the file read and the copy into fresh caches)."""
        self.hits += 1
        self.restored_tokens += tokens
        self.restore_s += seconds

    def _refresh(self) -> list[Stored]:
        """This model's entries in the directory now: new files' headers are read once, gone ones forgotten."""
        seen: dict[Path, tuple[int, Stored | None]] = {}
        for path in entry_files(self.root):
            try:
                mtime = path.stat().st_mtime_ns
            except FileNotFoundError:
                continue
            with self._lock:
                known = self._index.get(path)
            seen[path] = known if known is not None and known[0] == mtime else (mtime, self._header(path))
        with self._lock:
            self._index = seen
        return [s for _, s in seen.values() if s is not None]

    def _header(self, path: Path) -> Stored | None:
        try:
            stored = read_header(path)
        except FileNotFoundError:
            return None
        except BadFile as e:
            self._bad(path, e)
            return None
        if stored.model == self.model and stored.identity != self.identity:
            log.info("prompt cache: removing %s, written for an earlier %s file", path.name, self.model)
            path.unlink(missing_ok=True)  # the model file changed: its KV no longer matches
            return None
        return stored if stored.layout == self.layout and stored.identity == self.identity else None

    def _bad(self, path: Path, e: BaseException) -> None:
        log.warning("prompt cache: removing unreadable disk entry %s: %s", path.name, e)
        path.unlink(missing_ok=True)
        self.removed_bad += 1

    def stats(self) -> dict[str, Any]:
        """This model's counters and entries (the directory's totals come from disk_files.usage)."""
        with self._lock:
            mine = [s.size for _, s in self._index.values() if s is not None]
        return {"entries": len(mine), "bytes": sum(mine), "hits": self.hits, "misses": self.misses,
                "restored_tokens": self.restored_tokens, "restore_seconds": round(self.restore_s, 6),
                "read_bytes": self.read_bytes, "writes": self.writes, "writes_dropped": self.dropped,
                "writes_pending": self._queue.unfinished_tasks,
                "skipped_slower_than_prefill": self.skipped, "removed_bad": self.removed_bad}
