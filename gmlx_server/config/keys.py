"""server.api_keys and server.fair_share -> ApiKey / FairShare: each key named, scoped and read from exactly one
of `key`, `key_env` or `key_file`; errors name the entry's dotted key and never show a key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gmlx_server.config.checker import Checker
from gmlx_server.config.env import variable
from gmlx_server.config.settings import KEY_SCOPES, LEGACY_KEY_NAME, ApiKey, FairShare

_KEY_FIELDS = frozenset({"name", "key", "key_env", "key_file", "scope", "max_concurrent", "max_queued"})
_SHARE_FIELDS = frozenset({"max_concurrent", "max_queued"})
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a metrics label value and a log token


def parse_fair_share(c: Checker, raw: Any, at: str) -> FairShare:
    data = c.section(raw, at, _SHARE_FIELDS if at == "server.fair_share" else None)
    concurrent = c.value(data, at, "max_concurrent", "int")
    queued = c.value(data, at, "max_queued", "int")
    if concurrent == 0:
        raise c.fail(f"{at}.max_concurrent", "must be at least 1 (leave it out for no limit)")
    return FairShare(concurrent, queued)


def parse_api_keys(c: Checker, raw: Any) -> tuple[ApiKey, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise c.fail("server.api_keys", "expected a list of {name, key | key_env | key_file, scope}")
    keys = tuple(_key(c, item, f"server.api_keys[{i}]") for i, item in enumerate(raw))
    names = [k.name for k in keys]
    for i, k in enumerate(keys):
        if k.name in names[:i] or k.name == LEGACY_KEY_NAME:
            raise c.fail(f"server.api_keys[{i}].name", f"'{k.name}' is taken (names are unique; "
                                                        f"'{LEGACY_KEY_NAME}' is server.api_key's)")
        if any(k.key == other.key for other in keys[:i]):
            raise c.fail(f"server.api_keys[{i}]", "the same key as an earlier entry")
    return keys


def _key(c: Checker, raw: Any, at: str) -> ApiKey:
    data = c.section(raw, at, _KEY_FIELDS)
    name = c.value(data, at, "name", "str")
    if name is None or not _NAME.fullmatch(name):
        raise c.fail(f"{at}.name", "expected a name of letters, digits, '_', '.' or '-' (at most 64)")
    scope = c.value(data, at, "scope", "str", "client")
    if scope not in KEY_SCOPES:
        raise c.fail(f"{at}.scope", f"expected one of {', '.join(KEY_SCOPES)}, got {scope!r}")
    share = parse_fair_share(c, {k: data[k] for k in _SHARE_FIELDS if k in data}, at) \
        if _SHARE_FIELDS & data.keys() else None
    return ApiKey(name, _secret(c, data, at), scope, share)


def _secret(c: Checker, data: dict[str, Any], at: str) -> str:
    given = [k for k in ("key", "key_env", "key_file") if data.get(k) is not None]
    if len(given) != 1:
        raise c.fail(at, "give exactly one of key, key_env or key_file")
    how = given[0]
    ref = c.value(data, at, how, "str")
    if how == "key":
        secret = ref
    elif how == "key_env":
        secret = variable(ref) or ""
        if not secret:
            raise c.fail(f"{at}.key_env", f"the environment variable {ref} is not set")
    else:
        secret = _read_key_file(c, Path(ref).expanduser(), f"{at}.key_file")
    if not secret.strip():
        raise c.fail(f"{at}.{how}", "the key is empty")
    return str(secret).strip()


def _read_key_file(c: Checker, path: Path, at: str) -> str:
    path = path if path.is_absolute() else Path(c.source).parent / path
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise c.fail(at, f"cannot read {path}: {type(e).__name__}") from None
