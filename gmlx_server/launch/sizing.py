"""How much output a client gets: what the model's window leaves beside the client's own fixed prompt.

Each client's first request carries its system prompt and tool definitions before the user says a word.
Measured in SmolLM2 tokens from the first request of the versions scripts/install_agents.sh pins (gmlx
writes the tools into the prompt for a template without a tool syntax); tests/agents checks the table
against the real clients.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gmlx_server.config.settings import DEFAULT_TOOL_PROMPT_BUDGET

SPREAD = 1.1  # the table counts SmolLM2 tokens; other tokenizers write the same text within a tenth of that


@dataclass(frozen=True)
class FixedPrompt:
    full: int  # the system prompt and tools as the client writes them
    tools: int = 0  # of which the tools, in full (0: not measured apart)
    compact: int | None = None  # the whole prompt with the server's compact tool rendering (None: not measured)

    def at(self, window: int, share: float = DEFAULT_TOOL_PROMPT_BUDGET) -> int:
        """What the model gets: past the model's tool_prompt_budget share of its window the server renders the
        tools compactly, where that was measured; otherwise, or within the tokenizers' spread of that line (Qwen
        writes Claude Code's tools in 15,967 tokens, under half of 32768), the full figure (an upper bound)."""
        return self.compact if self.compact is not None and self.tools > SPREAD * share * window else self.full

    def compact_budget(self, window: int) -> float | None:
        """A tool_prompt_budget (in twentieths) that has the server render these tools compactly on this window,
        when the prompt then fits (is at most half of it); None when none does."""
        if self.compact is None or 2 * self.compact > window:
            return None
        share = math.floor(20 * self.tools / (SPREAD * window)) / 20
        return share if share > 0 else None

    def on(self, row: Mapping[str, Any]) -> int:
        """at() for a /v1/models row: the server weighs the tools against the model's whole window."""
        return self.at(int(row["context_length"]), float(row.get("tool_prompt_budget") or DEFAULT_TOOL_PROMPT_BUDGET))


# Claude Code: 3,196 tokens without its 24 tools, 17,027 for them in full, 2,140 compactly (its captured first
# request, tests/data/agents/claude-session.json, counted by count_tokens on SmolLM2). opencode: 2,213 without
# its 10 tools, 5,406 for them in full, 3,062 in all compactly (its captured first request, /v1/estimate).
# Codex's and pi's tools are under half of SmolLM2's window, so the server renders them in full.
FIXED_PROMPT = {"pi": FixedPrompt(1_500), "codex": FixedPrompt(6_200), "opencode": FixedPrompt(7_620, 5_406, 3_062),
                "claude": FixedPrompt(20_223, 17_027, 5_336)}
MAX_OUTPUT_CEILING = 32_000  # no more than frontier APIs allow
MIN_OUTPUT = 128  # less than this is not an answer: launch refuses instead


def fitting_max_output(window: int, fixed: int = 0) -> int | None:
    """A quarter of the window (at most 32000); None when that is under MIN_OUTPUT, or when the client's own prompt
    takes more than half the window: its conversation would have less room than the prompt, and the small models
    such windows come with copy the agent's prompt back in a loop (docs/agents.md, "The harness matrix")."""
    out = min(window // 4, MAX_OUTPUT_CEILING)
    return out if out >= MIN_OUTPUT and 2 * fixed <= window else None


def context_window(row: Mapping[str, Any]) -> int:
    """The smaller of context_length and max_context_at_width_1, when that is known."""
    length = int(row["context_length"])
    at_width_1 = row.get("max_context_at_width_1")
    return min(length, int(at_width_1)) if at_width_1 else length


def ends_no_turn(row: Mapping[str, Any]) -> bool:
    """A base model (/v1/models `base`) whose profile adds no stop strings: nothing but the cap ends its reply."""
    return bool(row.get("base")) and not row.get("stop")


def models_that_fit(rows: Iterable[Mapping[str, Any]], fixed: FixedPrompt) -> list[str]:
    """The served chat models (and aliases) whose window leaves a client with this fixed prompt an answer, and
    which end their turns."""
    return [str(r["id"]) for r in rows if r.get("kind", "chat") == "chat" and r.get("context_length")
            and not ends_no_turn(r) and fitting_max_output(context_window(r), fixed.on(r)) is not None]


def needed_window(fixed: FixedPrompt) -> int:
    """The smallest window fitting_max_output accepts beside `fixed`: twice the prompt, and 4 x MIN_OUTPUT."""
    least = min(fixed.full, fixed.compact) if fixed.compact is not None else fixed.full
    return max(2 * least, 4 * MIN_OUTPUT)
