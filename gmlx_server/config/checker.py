"""Type checks for the YAML file that raise ConfigError naming the file and the dotted key."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gmlx_server.config.env import hf_hub_cache_dir
from gmlx_server.config.settings import SECRET_KEYS, ConfigError, RuntimeEnv
from gmlx_server.hf_cache import looks_like_repo_id, resolve_file, split_hf_ref

KINDS = {"str": (str,), "int": (int,), "bool": (bool,), "number": (int, float), "mapping": (dict,)}
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
ListCheck = Callable[[list[str]], tuple[str, ...]]  # normalizes a list or raises ValueError
log = logging.getLogger("gmlx.config")


class Checker:
    """Type checks that raise ConfigError with the file and dotted key."""

    def __init__(self, source: str, hf_cache: Path | None = None) -> None:
        self.source, self.hf_cache = source, hf_cache

    def fail(self, key: str, what: str) -> ConfigError:
        return ConfigError(self.source, key, what)

    def section(self, value: Any, key: str, allowed: frozenset[str] | None = None) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {type(value).__name__}")
        for k in value:
            if not isinstance(k, str):
                raise self.fail(f"{key}.{k}", "keys must be strings")
            if allowed is not None and k not in allowed:
                expected = ", ".join(sorted(allowed))
                raise self.fail(f"{key}.{k}" if key else k, f"unknown key (expected one of: {expected})")
        return value

    def value(self, data: Mapping[str, Any], key: str, name: str, kind: str, default: Any = None) -> Any:
        v = data.get(name, default)
        if v is None:
            return default
        ok = isinstance(v, KINDS[kind]) and not (kind in ("int", "number") and isinstance(v, bool))
        if not ok:
            shown = "" if name in SECRET_KEYS else f" ({v!r})"
            raise self.fail(f"{key}.{name}", f"expected {kind}, got {type(v).__name__}{shown}")
        if kind in ("int", "number") and v < 0:
            raise self.fail(f"{key}.{name}", f"must not be negative, got {v}")
        return v

    def path(self, raw: str, key: str, base: Path, must_exist: bool = True, repo_ok: bool = False) -> str:
        if raw.startswith("hf:"):
            return self.hf_ref(raw, key)
        p = Path(raw).expanduser()
        p = p if p.is_absolute() else base / p
        if must_exist and not p.exists():
            if repo_ok and looks_like_repo_id(raw):
                # The loader decides: 403 hf_access_disabled, or the local cache under server.hf_cache.
                log.warning("%s: %s: %r is not a local path; treated as a Hugging Face repo id", self.source,
                            key, raw)
                return raw
            raise self.fail(key, f"file not found: {p}")
        return str(p)

    def hf_ref(self, raw: str, key: str) -> str:
        """hf:org/repo/file.gguf -> its path in the local Hugging Face cache; never a download."""
        ref = split_hf_ref(raw)
        if ref is None:
            raise self.fail(key, f"expected hf:org/repo/path/file.gguf, got {raw!r}")
        cache = self.hf_cache or hf_hub_cache_dir(RuntimeEnv())
        found = resolve_file(cache, *ref)
        if found is None:
            raise self.fail(key, f"{raw} is not in the local Hugging Face cache ({cache}); the server never "
                                 f"downloads models: fetch it first (huggingface-cli download {ref[0]} {ref[1]})")
        return str(found)

    def size(self, v: Any, key: str) -> int | None:
        """Bytes, or a size like 24GiB; None for auto."""
        if v is None or v == "auto":
            return None
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", str(v).lower())
        if not m:
            raise self.fail(key, f"expected bytes, a size like 24GiB, or auto; got {v!r}")
        return int(float(m.group(1)) * _UNITS[m.group(2)])

    def name_list(self, data: Mapping[str, Any], key: str, check: ListCheck) -> tuple[str, ...]:
        raw = data.get(key.rpartition(".")[2]) or []
        if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
            raise self.fail(key, "expected a list of strings")
        try:
            return check(raw)
        except ValueError as err:
            raise self.fail(key, str(err)) from None
