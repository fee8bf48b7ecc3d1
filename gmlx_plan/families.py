"""Model families: what the server knows per family, in one record, matched from any name it meets.

A family is named by a GGUF architecture (gemma3), an mlx-vlm model type (gemma3_text), a configured family
(qwen) or a model name (SmolLM2 is a llama). The engine's architecture table, the intents' sampling rows, the
built-in chat templates and the tokenizer's SentencePiece quirks all read the same record.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str  # the intents table's row: llama, qwen, gemma, mistral, or default
    template: str | None  # built-in chat template when a GGUF has none; None: the vocabulary decides
    spelled_spaces: bool = False  # SentencePiece vocab stores space runs as spaces, merges follow file order,
    #                               and no space prefix is added (Gemma)


LLAMA = Family("llama", None)  # llama3 when the vocabulary has its header tokens, else chatml
QWEN = Family("qwen", "chatml")
GEMMA = Family("gemma", "gemma", spelled_spaces=True)
MISTRAL = Family("mistral", None)
DEFAULT = Family("default", None)

# Name prefixes, most specific first (mixtral before mistral would not matter; smollm is llama-built).
_PREFIXES: tuple[tuple[str, Family], ...] = (
    ("qwen", QWEN), ("chatml", QWEN), ("gemma", GEMMA), ("mistral", MISTRAL), ("mixtral", MISTRAL),
    ("llama", LLAMA), ("smollm", LLAMA),
)


def family_of(name: str) -> Family:
    """The family of an architecture, model type or family name; DEFAULT when none matches."""
    lowered = name.lower()
    return next((family for prefix, family in _PREFIXES if lowered.startswith(prefix)), DEFAULT)
