"""Built-in intents (chat, coding, creative, precise) and the family base, per model family.

One table so an operator can read every default in one place. Values follow each family's
published generation defaults (Llama 3 generation_config, Qwen3 non-thinking mode, Gemma 3,
Mistral Small); the intents move temperature and the cut-offs from there.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from gmlx_plan.families import family_of

# family -> "base" (no profile at all) or an intent -> SamplingParams values.
SAMPLING_TABLE: Mapping[str, Mapping[str, Mapping[str, Any]]] = MappingProxyType({
    "llama": {
        "base":     {"temperature": 0.6, "top_p": 0.9},
        "chat":     {"temperature": 0.7, "top_p": 0.9},
        "coding":   {"temperature": 0.2, "top_p": 0.95},
        "creative": {"temperature": 1.0, "top_p": 0.95, "min_p": 0.05, "repetition_penalty": 1.05},
        "precise":  {"temperature": 0.0, "top_p": 1.0},
    },
    "qwen": {
        "base":     {"temperature": 0.7, "top_p": 0.8, "top_k": 20},
        "chat":     {"temperature": 0.7, "top_p": 0.8, "top_k": 20},
        "coding":   {"temperature": 0.3, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05},
        "creative": {"temperature": 1.0, "top_p": 0.95, "top_k": 40, "min_p": 0.05,
                     "repetition_penalty": 1.05},
        "precise":  {"temperature": 0.0, "top_p": 1.0, "top_k": 0},
    },
    "gemma": {
        "base":     {"temperature": 1.0, "top_p": 0.95, "top_k": 64},
        "chat":     {"temperature": 1.0, "top_p": 0.95, "top_k": 64},
        "coding":   {"temperature": 0.3, "top_p": 0.95, "top_k": 64},
        "creative": {"temperature": 1.1, "top_p": 0.95, "top_k": 64, "min_p": 0.05,
                     "repetition_penalty": 1.05},
        "precise":  {"temperature": 0.0, "top_p": 1.0, "top_k": 0},
    },
    "mistral": {
        "base":     {"temperature": 0.3, "top_p": 0.95},
        "chat":     {"temperature": 0.3, "top_p": 0.95},
        "coding":   {"temperature": 0.15, "top_p": 0.95},
        "creative": {"temperature": 0.8, "top_p": 0.95, "min_p": 0.05, "repetition_penalty": 1.05},
        "precise":  {"temperature": 0.0, "top_p": 1.0},
    },
    "default": {
        "base":     {"temperature": 0.7, "top_p": 0.95},
        "chat":     {"temperature": 0.7, "top_p": 0.95},
        "coding":   {"temperature": 0.2, "top_p": 0.95},
        "creative": {"temperature": 1.0, "top_p": 0.95, "min_p": 0.05, "repetition_penalty": 1.05},
        "precise":  {"temperature": 0.0, "top_p": 1.0},
    },
})



def table_family(family: str) -> str:
    """Map an engine family/architecture name (qwen3, gemma3_text, ...) to a row of the table."""
    return family_of(family).name


def family_sampling(family: str, intent: str | None) -> dict[str, Any]:
    """The family base, overlaid with the intent's values when an intent is named."""
    row = SAMPLING_TABLE[table_family(family)]
    values = dict(row["base"])
    if intent is not None:
        values.update(row[intent])
    return values
