"""The bounded in-memory store behind /v1/responses' previous_response_id.

One instance per app (create_app builds it): a process restart or an eviction forgets a
conversation, and the client gets a clear 404 instead of an answer without its history.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from gmlx_server.errors import GmlxError

DEFAULT_CAPACITY = 256

Conversation = tuple[Mapping[str, Any], ...]


class PreviousResponseNotFound(GmlxError):
    status, type = 404, "not_found_error"

    def __init__(self, response_id: str, capacity: int) -> None:
        super().__init__(
            f"previous response '{response_id}' not found: it was never stored (store: false), or it was "
            f"evicted (this server keeps the last {capacity} responses in memory, until restart)",
            param="previous_response_id", code="previous_response_not_found")


class ResponseStore:
    """LRU of response id -> the chat-template messages that response ended with (its input + output)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, Conversation] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, response_id: str, messages: Sequence[Mapping[str, Any]]) -> None:
        self._items[response_id] = tuple(messages)
        self._items.move_to_end(response_id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> Conversation:
        """The stored conversation (a use refreshes it); PreviousResponseNotFound if unknown or evicted."""
        try:
            self._items.move_to_end(response_id)
        except KeyError:
            raise PreviousResponseNotFound(response_id, self.capacity) from None
        return self._items[response_id]
