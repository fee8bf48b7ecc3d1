"""The harnesses `gmlx launch` knows: how each is installed and how it is pointed at gmlx."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gmlx_server.launch.codex import codex
from gmlx_server.launch.invocation import LOCAL_KEY, Client, Invocation, home, write_atomic
from gmlx_server.launch.opencode import opencode
from gmlx_server.launch.server import ModelTarget

__all__ = ["CLIENTS", "Client", "Invocation"]
PI_DEFAULT_RESERVE = 16_384  # pi's compaction.reserveTokens default (docs/compaction.md)


def claude(url: str, key: str | None, t: ModelTarget, args: list[str], env: Mapping[str, str]) -> Invocation:
    """Claude Code reads environment variables only; every model tier points at the local model."""
    out = {k: v for k, v in env.items() if k != "ANTHROPIC_API_KEY"}  # it would win over the token
    side = side_calls(t.requested)
    out.update({
        "ANTHROPIC_BASE_URL": url, "ANTHROPIC_AUTH_TOKEN": key or LOCAL_KEY, "ANTHROPIC_MODEL": t.requested,
        "ANTHROPIC_SMALL_FAST_MODEL": side, "ANTHROPIC_DEFAULT_HAIKU_MODEL": side,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": t.requested, "ANTHROPIC_DEFAULT_OPUS_MODEL": t.requested,
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(t.max_output),
        "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    })
    # Claude Code cannot lower its auto-compact window below 100k tokens: it compacts when the
    # server answers "prompt is too long", which gmlx's 400 says.
    return Invocation(["claude", *args], out, notes=[f"max output {t.max_output} tokens (env)"])


def side_calls(model: str) -> str:
    """The model Claude Code's side calls (titles, summaries, its haiku tier) name: the same model at batch
    priority (a built-in profile), so they queue behind the turn the user waits on; a model already naming a
    profile keeps it."""
    return model if "@" in model else f"{model}@batch"


def pi_models_file(env: Mapping[str, str]) -> Path:
    return home(env, "PI_CODING_AGENT_DIR", ".pi", "agent") / "models.json"


def pi_provider(url: str, key: str | None, t: ModelTarget, existing: Mapping[str, Any] | None) -> dict[str, Any]:
    """The `gmlx` provider of pi's models.json: the launched model replaces any entry of the same id."""
    model = {"id": t.requested, "name": f"{t.requested} (gmlx)", "reasoning": False, "input": ["text"],
             "contextWindow": t.context_window, "maxTokens": t.max_output,
             "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}}
    others = [m for m in (existing or {}).get("models", []) if isinstance(m, dict) and m.get("id") != t.requested]
    return {"baseUrl": f"{url}/v1", "api": "openai-completions", "apiKey": key or LOCAL_KEY,
            # gmlx takes the system prompt as a system message; a local template may not know `developer`.
            "compat": {"supportsDeveloperRole": False}, "models": [*others, model]}


def pi(url: str, key: str | None, t: ModelTarget, args: list[str], env: Mapping[str, str]) -> Invocation:
    path = pi_models_file(env)
    data: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    providers = data.setdefault("providers", {})
    providers["gmlx"] = pi_provider(url, key, t, providers.get("gmlx"))
    write_atomic(path, json.dumps(data, indent=2) + "\n")  # pi reloads the file while it runs
    notes = [f"context window {t.context_window}, max output {t.max_output} tokens"]
    reserve = pi_compaction_reserve(path.parent / "settings.json")
    if reserve > t.context_window // 2:
        # Global to pi, so advised rather than written: lowering it would shrink cloud models' summaries too.
        notes.append(f"pi's compaction.reserveTokens ({reserve}) leaves this window no room: pi will compact "
                     f"after every turn and ask {int(0.8 * reserve)} output tokens for the summary; set it to "
                     f"{t.max_output} in {path.parent / 'settings.json'}, or serve with --clamp-max-tokens")
    return Invocation(["pi", "--provider", "gmlx", "--model", t.requested, *args], dict(env), [path], notes)


def pi_compaction_reserve(settings: Path) -> int:
    try:
        value = json.loads(settings.read_text()).get("compaction", {}).get("reserveTokens")
    except (OSError, ValueError, AttributeError):
        value = None
    return int(value) if isinstance(value, int) else PI_DEFAULT_RESERVE


CLIENTS: dict[str, Client] = {
    "claude": Client("Claude Code", "claude", "npm install -g @anthropic-ai/claude-code", claude,
                     "CLAUDE_CONFIG_DIR"),
    "codex": Client("Codex CLI", "codex", "npm install -g @openai/codex", codex, "CODEX_HOME"),
    "opencode": Client("opencode", "opencode", "npm install -g opencode-ai", opencode, "XDG_CONFIG_HOME"),
    "pi": Client("pi", "pi", "npm install -g @mariozechner/pi-coding-agent", pi, "PI_CODING_AGENT_DIR"),
}
