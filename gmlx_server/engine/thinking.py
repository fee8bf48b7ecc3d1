"""Reasoning markup as data (which template teaches which thinking block), and `thinking_budget`: cap the
tokens spent inside the model's thinking block, then close it.

The syntaxes are pure data and string matching: the service picks one per request from the chat template,
the protocol layer splits the reply on its tags, the engine closes a block whose budget ran out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gmlx_server.engine.types import ThinkingControl


@dataclass(frozen=True)
class ReasoningSyntax:
    """One family of thinking blocks: the tag that opens one and the tag that closes it."""

    name: str
    open_tag: str
    close_tag: str

    def control(self, budget: int | None) -> ThinkingControl:
        return ThinkingControl(budget=budget, open_tag=self.open_tag, close_tag=self.close_tag)


THINK = ReasoningSyntax("think", "<think>", "</think>")  # Qwen3, QwQ, DeepSeek-R1 and its distills, SmolLM3
SEED_THINK = ReasoningSyntax("seed_think", "<seed:think>", "</seed:think>")  # ByteDance Seed-OSS
MISTRAL_THINK = ReasoningSyntax("mistral_think", "[THINK]", "[/THINK]")  # Magistral
# First match wins: Seed's tag contains "think>", so it is tried before the plain one.
_REASONING_RULES: tuple[ReasoningSyntax, ...] = (SEED_THINK, MISTRAL_THINK, THINK)


def infer_reasoning(template_source: str) -> ReasoningSyntax | None:
    """The thinking block a chat template teaches (it writes or strips the tags), or None: it teaches none."""
    return next((s for s in _REASONING_RULES if s.open_tag in template_source and s.close_tag in template_source),
                None)


@dataclass(frozen=True)
class ReasoningUse:
    """How one request's reply carries reasoning: the block's tags, whether the prompt already opened one,
    and where the reader reports the tokens spent thinking."""

    syntax: ReasoningSyntax
    starts_inside: bool = False
    report: Callable[[int], None] | None = None


class ThinkingBudget:
    """Watches emitted text; once the budget is spent inside a thinking block, supplies the close tag's tokens."""

    def __init__(self, control: ThinkingControl, encode: Callable[[str], list[int]], starts_inside: bool) -> None:
        self._c = control
        self._close_ids = encode("\n" + control.close_tag)
        self.inside = starts_inside
        self.spent = 0
        self._tail = ""
        self._forced: list[int] = []
        self.closed_by_budget = False

    def observe(self, text: str) -> None:
        """Call with each decoded text piece, in order."""
        self._tail = (self._tail + text)[-64:]
        if self.inside:
            self.spent += 1
            if self._c.close_tag in self._tail:
                self.inside, self._tail = False, ""
            elif self._c.budget is not None and self.spent >= self._c.budget and not self._forced:
                self._forced = list(self._close_ids)
                self.closed_by_budget = True
        elif self._c.open_tag in self._tail:
            self.inside, self.spent, self._tail = True, 0, ""

    def next_forced(self) -> int | None:
        """The next token to force instead of sampling, if the budget ran out."""
        if not self._forced:
            return None
        tok = self._forced.pop(0)
        if not self._forced:
            self.inside = False
        return tok
