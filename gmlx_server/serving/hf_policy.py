"""The Hugging Face policy at the model loader: nothing reaches the engine factory
that only a download could turn into a model.

A repo id, an unresolved hf: ref or a URL gets 403 hf_access_disabled. With server.hf_cache: true a repo id
(or hf: ref) resolves from the local hub cache instead, by reading its folders, never the network.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gmlx_server.config import ModelEntry, ServerConfig, hf_hub_cache_dir
from gmlx_server.errors import HFAccessDisabled
from gmlx_server.hf_cache import looks_like_repo_id, looks_remote, resolve_file, resolve_repo, split_hf_ref


def _from_cache(path: str, cache: Path, repos: bool) -> Path | None:
    """An hf: ref always resolves from the cache (as in the config); a bare repo id only under server.hf_cache."""
    ref = split_hf_ref(path) if path.startswith("hf:") else None
    if ref is not None:
        return resolve_file(cache, *ref)
    return resolve_repo(cache, path) if repos and looks_like_repo_id(path) else None


def local_entry(entry: ModelEntry, config: ServerConfig) -> ModelEntry:
    """The entry to load, with a local path; HFAccessDisabled when only the network could provide it."""
    if not looks_remote(entry.path) or Path(entry.path).exists():
        return entry
    cache = hf_hub_cache_dir(config.env)
    found = _from_cache(entry.path, cache, config.server.hf_cache)
    if found is not None:
        return replace(entry, path=str(found))
    where = (f"it is not in the local Hugging Face cache ({cache})" if config.server.hf_cache
             else "set server.hf_cache: true to serve a repo from the local Hugging Face cache")
    raise HFAccessDisabled(f"model '{entry.id}' names '{entry.path}' instead of a local GGUF file or folder, and "
                           f"this server never downloads models: {where}", param="model")
