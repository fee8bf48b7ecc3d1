"""`thinking_budget`: cap the tokens spent inside the model's thinking block, then close it."""

from __future__ import annotations

from collections.abc import Callable

from gmlx_server.engine.types import ThinkingControl


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
