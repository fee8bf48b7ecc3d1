"""models.<id>.draft and draft_tokens -> Draft: the drafter a speculative model decodes with.

`draft:` names a configured id (its path and weights layout), an hf:org/repo/file.gguf ref (from the local
cache, as a model path) or a GGUF path (relative to the config file; auto layout). Every way it can be wrong
is a ConfigError naming the key, at start and at reload: a missing or unreadable file, a drafter whose token
list differs from the target's (both files named), a bad draft_tokens, a target that is not a local GGUF
file, and kvarn with an unquantized tail (its attention depends on how many tokens a pass writes, so a
round's verification could not reproduce plain decoding).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from gmlx_plan.geometry import GeometryError, geometry_from_header
from gmlx_plan.gguf_header import GGUFFormatError, GGUFHeader, read_header, token_list_difference
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
    """Each model's Draft, once every model id is known (a draft may name one); headers are read here."""
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
        draft = Draft(named.path, name, k, named.weights)
    else:
        path = c.hf_ref(name, key) if name.startswith("hf:") else c.path(name, key, base)
        draft = Draft(path, Path(path).stem, k)
    target_header = _header(c, f"models.{target.id}.path", target.path, "a speculative model")
    draft_header = _header(c, key, draft.path, "a drafter")
    problem = token_list_difference(draft_header, target_header)
    if problem is not None:
        raise c.fail(key, f"the drafter must share the target's token list: {problem}")
    return draft


def _header(c: Checker, key: str, path: str, what: str) -> GGUFHeader:
    if not path.lower().endswith(".gguf") or not Path(path).is_file():
        raise c.fail(key, f"{what} must be a local GGUF file, got {path}")
    try:
        header = read_header(path)
        geometry_from_header(header)
    except (GGUFFormatError, GeometryError) as e:
        raise c.fail(key, str(e)) from None
    return header
