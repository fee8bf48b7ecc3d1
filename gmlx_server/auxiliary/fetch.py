"""Where a service's model lives: a local path now, or an hf: repo fetched once, in the background, into the
Hugging Face cache (chat models never are: their hf: refs only resolve from the cache)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gmlx_server.auxiliary.service_errors import ServiceUnavailable
from gmlx_server.errors import ModelLoadDeferred

log = logging.getLogger("gmlx.services")
DOWNLOAD_RETRY_S = 5.0  # Retry-After while a download runs


def split_repo(ref: str) -> tuple[str, str]:
    """hf:org/repo/path/inside -> ("org/repo", "path/inside"); the path may be empty."""
    parts = ref.removeprefix("hf:").strip("/").split("/")
    return "/".join(parts[:2]), "/".join(parts[2:])


class ModelSource:
    """state: local (a path from the config), downloading, ready (fetched) or failed (with `error`)."""

    def __init__(self, kind: str, ref: str, cache_dir: Path, offline: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kind, self.ref, self.cache_dir, self.offline, self.clock = kind, ref, cache_dir, offline, clock
        self.remote = ref.startswith("hf:")
        self.state = "downloading" if self.remote else "local"
        self.path: Path | None = None if self.remote else Path(ref)
        self.error: str | None = None
        self.started = clock()
        self._thread: threading.Thread | None = None
        self._on_ready: list[Callable[[], None]] = []

    def start(self, on_ready: Callable[[], None] | None = None) -> None:
        """Begin the download (once); `on_ready` runs on the download thread when the files are there."""
        if on_ready is not None:
            if self.path is not None:
                on_ready()
                return
            self._on_ready.append(on_ready)
        if self.remote and self._thread is None:
            self._thread = threading.Thread(target=self._fetch, name=f"gmlx-fetch-{self.kind}", daemon=True)
            self._thread.start()

    def local_path(self) -> Path:
        """The model's local path; a typed 503 while it downloads or after the download failed."""
        if self.path is not None:
            return self.path
        if self.state == "failed":
            raise ServiceUnavailable(self.kind, f"downloading {self.ref} failed: {self.error}")
        waited = self.clock() - self.started
        raise ModelLoadDeferred(f"the {self.kind} service's model {self.ref} is downloading ({waited:.0f} s so "
                                f"far); retry after {DOWNLOAD_RETRY_S:g} s", DOWNLOAD_RETRY_S)

    def _fetch(self) -> None:
        repo, inner = split_repo(self.ref)
        try:
            snapshot = self._download(repo, inner)
            path = snapshot / inner if inner else snapshot
            if not path.exists():
                raise FileNotFoundError(f"{repo} has no {inner}")
        except Exception as exc:  # any failure is the service's state, never the server's end
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            log.error("service %s: downloading %s failed: %s", self.kind, self.ref, self.error)
            return
        self.path, self.state = path, "ready"
        log.info("service %s: %s is in %s (%.1f s)", self.kind, self.ref, path, self.clock() - self.started)
        for callback in self._on_ready:
            callback()

    def _download(self, repo: str, inner: str) -> Path:
        from huggingface_hub import snapshot_download  # installed with the services extra (and mlx-vlm)

        patterns = [inner, f"{inner}.*", f"{inner}/*"] if inner else None
        try:  # what the cache already holds needs no network
            return Path(snapshot_download(repo, cache_dir=self.cache_dir, allow_patterns=patterns,
                                          local_files_only=True))
        except Exception:
            if self.offline:
                raise RuntimeError(f"{repo} is not in the local Hugging Face cache ({self.cache_dir}) and "
                                   "server.hf_cache keeps the server offline") from None
        log.info("service %s: downloading %s into %s", self.kind, self.ref, self.cache_dir)
        return Path(snapshot_download(repo, cache_dir=self.cache_dir, allow_patterns=patterns))
