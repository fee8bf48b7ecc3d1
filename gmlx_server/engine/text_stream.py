"""Per-request text bookkeeping: incremental text, stop strings across token boundaries, EOS, max tokens.

Pure Python (no MLX), so every finish rule is tested without a model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gmlx_server.engine.types import FinishReason


@dataclass
class StepResult:
    text: str  # text safe to emit now
    finish: FinishReason | None = None
    stop_string: str | None = None


class TextStream:
    """Turns token ids into emitted text; holds back any tail that could still become a stop string."""

    def __init__(
        self,
        add_token: Callable[[int], str],
        flush: Callable[[], str],
        stop: Sequence[str],
        eos_ids: frozenset[int],
        max_tokens: int,
    ) -> None:
        self._add, self._flush = add_token, flush
        self._stops = tuple(s for s in stop if s)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._eos, self._max = eos_ids, max_tokens
        self._pending = ""  # decoded text not emitted yet
        self.generated = 0

    def feed(self, token_id: int) -> StepResult:
        self.generated += 1
        if token_id in self._eos:
            return StepResult(self._pending + self._flush(), "stop")
        self._pending += self._add(token_id)
        hit = self._find_stop()
        if hit is not None:
            return hit
        if self.generated >= self._max:
            return StepResult(self.drain(), "length")
        return StepResult(self._take_safe())

    def _find_stop(self) -> StepResult | None:
        best: tuple[int, str] | None = None
        for s in self._stops:
            i = self._pending.find(s)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        text = self._pending[: best[0]]
        self._pending = ""
        return StepResult(text, "stop", best[1])

    def _take_safe(self) -> str:
        # Keep the longest suffix that is a prefix of some stop string; emit the rest.
        keep = 0
        for n in range(min(self._hold, len(self._pending)), 0, -1):
            tail = self._pending[-n:]
            if any(s.startswith(tail) for s in self._stops):
                keep = n
                break
        out, self._pending = self._pending[: len(self._pending) - keep], self._pending[len(self._pending) - keep:]
        return out

    def drain(self) -> str:
        """Everything not emitted yet, held-back text included (the request ends here)."""
        out, self._pending = self._pending + self._flush(), ""
        return out
