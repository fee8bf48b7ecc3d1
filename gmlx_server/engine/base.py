"""Honest defaults for the engine contract's optional capabilities, shared by the MLX engine and test fakes:
no memory reading, no prompt cache, no shedding, and blocking generation over submit()."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from gmlx_server.engine.types import GenerationRequest, MemorySnapshot, PromptCacheStats, RequestHandle, TokenEvent


class EngineBase:
    memory: MemorySnapshot | None = None

    def submit(self, request: GenerationRequest) -> RequestHandle:
        raise NotImplementedError

    def generate_sync(self, request: GenerationRequest, on_event: Callable[[TokenEvent], None]) -> None:
        """Drive submit() on a private event loop until the final event."""

        async def run() -> None:
            async for event in self.submit(request):
                on_event(event)

        asyncio.run(run())

    def cache_stats(self) -> PromptCacheStats:
        return PromptCacheStats()

    def cache_peek(self, prompt_tokens: Sequence[int]) -> tuple[str, int]:
        return ("miss", 0)

    def expected_warm(self, prompt_tokens: Sequence[int]) -> int:
        return 0

    def reset_cache(self) -> bool:
        return False

    def shed(self, request_id: str, reason: str) -> bool:
        return False
