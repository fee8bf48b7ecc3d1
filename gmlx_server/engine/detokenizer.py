"""Streaming detokenization: token ids in, text deltas out, never a broken UTF-8 character.

Works on each token's raw bytes (`token_bytes`), so a character split over byte-fallback tokens
(<0xE2><0x82><0xAC> for '€') or over byte-level BPE pieces (emoji) is held back until complete.
Per token it costs one table lookup and one incremental UTF-8 decode: nothing is re-decoded.
"""

from __future__ import annotations

import codecs
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gmlx_server.engine.types import Tokenizer


class IncrementalDetokenizer:
    """Feed ids one by one; the joined deltas equal `tokenizer.decode(ids)` once flushed."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip = tokenizer.special_ids if skip_special_tokens else frozenset()
        # 'replace' matches decode(): invalid bytes become U+FFFD, incomplete tails wait for more.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip_pending = tokenizer.strip_leading_space
        self._parts: list[str] = []
        self._text: str | None = ""

    def add(self, token_id: int) -> str:
        """The text this token completes ('' while a multi-byte character is still partial)."""
        if token_id in self._skip:
            return ""
        return self._emit(self._decoder.decode(self._tokenizer.token_bytes(token_id)))

    def flush(self) -> str:
        """End of stream: whatever is still held back (an incomplete tail becomes U+FFFD)."""
        return self._emit(self._decoder.decode(b"", final=True))

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        if self._text is None:
            self._text = "".join(self._parts)
            self._parts = [self._text]
        return self._text

    def _emit(self, delta: str) -> str:
        if self._strip_pending and delta:
            # SentencePiece's space prefix: decode() drops the first space of the whole text, once.
            self._strip_pending = False
            if delta.startswith(" "):
                delta = delta[1:]
        if delta:
            self._parts.append(delta)
            self._text = None
        return delta
