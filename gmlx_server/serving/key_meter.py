"""Per-key counts for Prometheus: requests by status, refusals, and tokens. The labels are configured key names
(and `anonymous`), never keys or client addresses, so the series stay as few as the config's keys."""

from __future__ import annotations

from collections import Counter


class KeyMeter:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str]] = Counter()  # (key name, HTTP status)
        self.tokens: Counter[tuple[str, str]] = Counter()  # (key name, prompt | generated)

    def request(self, key: str, status: int) -> None:
        self.requests[(key, str(status))] += 1

    def used(self, key: str, prompt_tokens: int, generated: int) -> None:
        self.tokens[(key, "prompt")] += prompt_tokens
        self.tokens[(key, "generated")] += generated

    def refused(self) -> Counter[tuple[str, str]]:
        """The requests answered 4xx or 5xx, by key and status."""
        return Counter({k: n for k, n in self.requests.items() if int(k[1]) >= 400})
