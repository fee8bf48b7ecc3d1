"""Hugging Face references resolved from the local hub cache by reading its directory layout; never the network.

The hub cache keeps `models--<org>--<repo>/snapshots/<commit>/<file>` (links into blobs/) and
`models--<org>--<repo>/refs/main` (the commit that main pointed at when it was fetched). No huggingface_hub
call is made: its download functions may reach the network even when the file is cached.
"""

from __future__ import annotations

import re
from pathlib import Path

_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_URL = re.compile(r"[a-z][a-z0-9+.-]*://", re.IGNORECASE)


def looks_like_repo_id(text: str) -> bool:
    """`org/repo`: one slash, hub-legal names, and not a file name a user would type for a GGUF."""
    return _REPO_ID.fullmatch(text) is not None and not text.lower().endswith(".gguf")


def looks_remote(text: str) -> bool:
    """A repo id, an hf: ref or a URL: something only a download could turn into a model."""
    return text.startswith("hf:") or _URL.match(text) is not None or looks_like_repo_id(text)


def split_hf_ref(ref: str) -> tuple[str, str] | None:
    """`hf:org/repo/dir/file.gguf` -> ("org/repo", "dir/file.gguf"); None when it is not that shape."""
    parts = ref.removeprefix("hf:").split("/", 2)
    if len(parts) < 3 or not looks_like_repo_id(f"{parts[0]}/{parts[1]}"):
        return None
    inner = parts[2]
    if not inner or inner.startswith("/") or ".." in inner.split("/"):
        return None
    return f"{parts[0]}/{parts[1]}", inner


def _snapshots(cache: Path, repo: str) -> list[Path]:
    """The repo's snapshot folders: the one refs/main names first, then the newest."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snaps = root / "snapshots"
    if not snaps.is_dir():
        return []
    found = sorted((p for p in snaps.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    main = root / "refs" / "main"
    if main.is_file():
        head = main.read_text(encoding="utf-8").strip()
        found.sort(key=lambda p: p.name != head)  # stable: keeps newest-first among the rest
    return found


def resolve_file(cache: Path, repo: str, file: str) -> Path | None:
    """The cached file (its snapshot path, so the name keeps its .gguf suffix), or None."""
    for snap in _snapshots(cache, repo):
        candidate = snap / file
        if candidate.is_file():
            return candidate
    return None


def resolve_repo(cache: Path, repo: str) -> Path | None:
    """A cached repo: its one model GGUF when the snapshot holds exactly one (this loader reads GGUF), else
    the snapshot folder; None when the repo is not cached."""
    snaps = _snapshots(cache, repo)
    if not snaps:
        return None
    ggufs = [p for p in sorted(snaps[0].glob("*.gguf")) if not p.name.lower().startswith("mmproj")]
    return ggufs[0] if len(ggufs) == 1 else snaps[0]
