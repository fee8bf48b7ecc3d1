"""models.<id>.draft and draft_tokens -> Draft: the drafter a speculative model decodes with.

`draft:` names a configured id (its path and weights layout), an hf:org/repo/file.gguf ref (from the local
cache, as a model path) or a GGUF path (relative to the config file; auto layout). What the keys alone can
get wrong is a ConfigError naming the key: a missing file, a bad draft_tokens, and kvarn with an unquantized
tail (its attention depends on how many tokens a pass writes, so a round's verification could not reproduce
plain decoding). The config reads no GGUF header: the drafter's token list against the target's is
serving/model_files.py's `check_drafts`, which the entry points and /v1/reload run on the loaded config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from gmlx_server.config.checker import Checker
from gmlx_server.config.settings import DEFAULT_DRAFT_TOKENS, MAX_DRAFT_TOKENS, Draft, ModelEntry

DRAFT_KEYS = frozenset({"draft", "draft_tokens"})
RawDrafts = dict[str, tuple[str, int]]  # model id -> (the draft: string, draft_tokens)


def raw_draft(c: Checker, data: Mapping[str, Any], key: str) -> tuple[str, int] | None:
    """A model section's draft keys, checked for type and range; None without `draft:`."""
    draft, k = c.value(data, key, "draft", "str"), c.value(data, key, "draft_tokens", "int")
    if k is not None and not 1 <= k <= MAX_DRAFT_TOKENS:
        raise c.fail(f"{key}.draft_tokens", f"must be 1 to {MAX_DRAFT_TOKENS}, got {k}")
    if draft is None:
        if k is not None:
            raise c.fail(f"{key}.draft_tokens", "set without draft (the drafter that proposes the tokens)")
        return None
    if not draft.strip():
        raise c.fail(f"{key}.draft", "expected a configured model id, a GGUF path or hf:org/repo/file.gguf")
    return draft, DEFAULT_DRAFT_TOKENS if k is None else k


def resolve_drafts(c: Checker, models: dict[str, ModelEntry], raw: RawDrafts, base: Path) -> dict[str, ModelEntry]:
    """Each model's Draft, once every model id is known (a draft may name one)."""
    out = dict(models)
    for mid, (name, k) in raw.items():
        out[mid] = replace(models[mid], draft=_draft(c, models, models[mid], name, k, base))
    return out


def _draft(c: Checker, models: Mapping[str, ModelEntry], target: ModelEntry, name: str, k: int,
           base: Path) -> Draft:
    key = f"models.{target.id}.draft"
    q = target.kv_quant
    if q is not None and q.scheme == "kvarn" and q.tail:
        raise c.fail(key, "kv_quant kvarn keeps its newest tail_tokens unquantized, so a pass's attention "
                          "depends on how many tokens it writes and a speculative round could not reproduce "
                          "plain decoding; use kv_quant scheme uniform, or kvarn with tail_tokens: 0")
    if name in models:
        named = models[name]
        return Draft(named.path, name, k, named.weights)
    path = c.hf_ref(name, key) if name.startswith("hf:") else c.path(name, key, base)
    return Draft(path, Path(path).stem, k)
