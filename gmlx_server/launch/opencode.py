"""opencode: a provider `gmlx` in its global config, the launched model chosen for this run only."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gmlx_server.launch.invocation import LOCAL_KEY, Invocation, home, write_atomic
from gmlx_server.launch.server import LaunchError, ModelTarget

PROVIDER = "gmlx"


def opencode_config_file(env: Mapping[str, str]) -> Path:
    return home(env, "XDG_CONFIG_HOME", ".config") / "opencode" / "opencode.json"


def opencode_provider(url: str, key: str | None, t: ModelTarget, existing: Any) -> dict[str, Any]:
    """The launched model joins the provider's other models; without `limit` opencode asks 32000 tokens."""
    models = dict(existing.get("models") or {}) if isinstance(existing, dict) else {}
    models[t.requested] = {"name": f"{t.requested} (gmlx)", "tool_call": True,
                           "limit": {"context": t.context_window, "output": t.max_output}}
    return {"npm": "@ai-sdk/openai-compatible", "name": "gmlx",
            "options": {"baseURL": f"{url}/v1", "apiKey": key or LOCAL_KEY}, "models": models}


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {"$schema": "https://opencode.ai/config.json"}
    try:
        data = json.loads(path.read_text())
    except ValueError as e:  # JSONC (comments, trailing commas) is opencode's, not json's
        raise LaunchError(f"{path} is not plain JSON ({e}), so gmlx launch will not rewrite it; add the "
                          f"'{PROVIDER}' provider by hand, or pass --config-home DIR for a separate config") from None
    if not isinstance(data, dict):
        raise LaunchError(f"{path} does not hold a JSON object")
    return data


def opencode(url: str, key: str | None, t: ModelTarget, args: list[str], env: Mapping[str, str]) -> Invocation:
    path = opencode_config_file(env)
    data = _read(path)
    found = data.get("provider")
    providers: dict[str, Any] = found if isinstance(found, dict) else {}
    data["provider"] = {**providers, PROVIDER: opencode_provider(url, key, t, providers.get(PROVIDER))}
    write_atomic(path, json.dumps(data, indent=2) + "\n")
    # The model (and the small model opencode titles sessions with) for this run only, on top of every config
    # file, so the user's own default model stays theirs and no title request leaves for another provider.
    chosen = f"{PROVIDER}/{t.requested}"
    inline = _inline(env.get("OPENCODE_CONFIG_CONTENT"))
    out = {**env, "OPENCODE_CONFIG_CONTENT": json.dumps({**inline, "model": chosen, "small_model": chosen})}
    return Invocation(["opencode", *args], out, [path],
                      [f"model {chosen}: context {t.context_window}, output {t.max_output} tokens"])


def _inline(raw: str | None) -> dict[str, Any]:
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        raise LaunchError("OPENCODE_CONFIG_CONTENT is set but is not JSON") from None
    return value if isinstance(value, dict) else {}
