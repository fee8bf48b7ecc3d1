"""The prompt cache's disk tier in a plan: what one session's snapshot takes and how many the cap holds.

A snapshot file is one KV cache (quantized KV stays packed), so its size is about the capacity table's KV bytes
per token times its tokens; a session keeps about one file (a longer snapshot replaces the shorter ones it covers).
Only the target model's KV is written, so a drafter's is left out.

JSON (`gmlx plan check --json`'s "disk_tier", absent when the cap is 0):
  {"cap_bytes": int, "depth": int, "kv_bytes_per_token": int, "bytes_per_session": int, "sessions": int}
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from gmlx_plan.budget import format_bytes
from gmlx_plan.memory import MemoryModel, kv_bytes_per_token


@dataclass(frozen=True)
class DiskTier:
    cap_bytes: int
    depth: int
    kv_bytes_per_token: int
    bytes_per_session: int
    sessions: int  # whole sessions at `depth` the cap holds

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        return (f"disk tier {format_bytes(self.cap_bytes)}: {self.sessions} sessions at {self.depth} tokens "
                f"({format_bytes(self.bytes_per_session)} each, {self.kv_bytes_per_token} B a token)")


def disk_tier(m: MemoryModel, cap_bytes: int, depth: int) -> DiskTier:
    per_token = kv_bytes_per_token(replace(m, draft=None))
    per_session = per_token * max(depth, 1)
    return DiskTier(cap_bytes, depth, per_token, per_session, cap_bytes // per_session if per_session else 0)
