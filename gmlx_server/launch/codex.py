"""Codex CLI: a `gmlx` model provider merged into $CODEX_HOME/config.toml, the model in a profile layer.

Codex's model settings are top-level keys of config.toml: writing them there would replace the user's own
model. They go to $CODEX_HOME/gmlx.config.toml instead, the layer `codex --profile gmlx` puts on top.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gmlx_server.launch.invocation import Invocation, home, write_atomic
from gmlx_server.launch.server import LaunchError, ModelTarget

PROFILE = PROVIDER = "gmlx"
KEY_ENV = "GMLX_API_KEY"  # the variable gmlx serve reads its own key from
_HEADER = re.compile(r"""^\s*\[\s*model_providers\s*\.\s*("gmlx"|'gmlx'|gmlx)\s*[].]""")
_ANY_HEADER = re.compile(r"^\s*\[")


def codex_home(env: Mapping[str, str]) -> Path:
    return home(env, "CODEX_HOME", ".codex")


def toml_value(v: str | int | bool) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v) if isinstance(v, int) else json.dumps(v)  # a JSON string is a TOML basic string


def toml_table(name: str, values: Mapping[str, str | int | bool]) -> str:
    return f"[{name}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in values.items())


def provider_table(url: str, key: str | None) -> dict[str, str | int | bool]:
    table: dict[str, str | int | bool] = {"name": "gmlx", "base_url": f"{url}/v1", "wire_api": "responses",
                                          "requires_openai_auth": False}
    if key:
        table["env_key"] = KEY_ENV  # the key itself stays out of the file
    return table


def _parse(text: str, path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise LaunchError(f"{path} is not valid TOML ({e}); fix it, or pass --config-home DIR") from None


def merge_provider(text: str, table: Mapping[str, str | int | bool], path: Path) -> str:
    """config.toml with [model_providers.gmlx] replaced: every other line, comment included, stays as it was,
    and the result must parse to the same settings apart from that table."""
    before = _parse(text, path)
    kept, inside = [], False
    for line in text.splitlines():
        if _ANY_HEADER.match(line):
            inside = bool(_HEADER.match(line))
        if not inside:
            kept.append(line)
    body = "\n".join(kept).rstrip("\n")
    merged = (body + "\n\n" if body else "") + toml_table(f"model_providers.{PROVIDER}", table)
    try:
        after = tomllib.loads(merged)
    except tomllib.TOMLDecodeError:
        after = None
    if after is None or _others(before) != _others(after):
        raise LaunchError(f"{path}: cannot replace [model_providers.{PROVIDER}] without touching other settings "
                          "(is it written inline?); edit it by hand, or pass --config-home DIR")
    return merged


def _others(settings: dict[str, Any]) -> dict[str, Any]:
    """Every setting but our provider's."""
    table = settings.get("model_providers")
    providers = {k: v for k, v in table.items() if k != PROVIDER} if isinstance(table, dict) else table
    rest = {k: v for k, v in settings.items() if k != "model_providers"}
    return {**rest, "model_providers": providers} if providers else rest


def profile_text(t: ModelTarget) -> str:
    # Codex 0.171 ignores model_max_output_tokens (it warns): room for the answer is kept by compacting early.
    values: dict[str, str | int | bool] = {
        "model": t.requested, "model_provider": PROVIDER, "model_context_window": t.context_window,
        "model_auto_compact_token_limit": t.context_window - t.max_output}
    return ("# Written by `gmlx launch codex` (rewritten on each launch): `codex --profile gmlx` runs the\n"
            "# model it last launched.\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in values.items()))


def codex(url: str, key: str | None, t: ModelTarget, args: list[str], env: Mapping[str, str]) -> Invocation:
    root = codex_home(env)
    config, profile = root / "config.toml", root / f"{PROFILE}.config.toml"
    text = config.read_text() if config.is_file() else ""
    write_atomic(config, merge_provider(text, provider_table(url, key), config))
    write_atomic(profile, profile_text(t))
    out = {**env, KEY_ENV: key} if key else dict(env)
    notes = [f"context window {t.context_window}, auto-compact at {t.context_window - t.max_output} tokens "
             f"(profile {PROFILE})",
             f"Codex sends no output cap: the server's default_max_tokens ({t.default_max_tokens}), at most half of "
             "what its prompt leaves in the window, bounds an answer"]
    return Invocation(["codex", "--profile", PROFILE, *args], out, [config, profile], notes)
