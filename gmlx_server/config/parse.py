"""The YAML file -> ServerConfig: every section checked, every key either honored or refused by name."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from gmlx_plan.memory import KV_DTYPE_CHOICES, LAYOUT_CHOICES
from gmlx_server.config.assistants import check_assistant_refs, parse_assistants, parse_mcp_servers
from gmlx_server.config.checker import KINDS, Checker
from gmlx_server.config.draft import DRAFT_KEYS, RawDrafts, raw_draft, resolve_drafts
from gmlx_server.config.keys import parse_api_keys, parse_fair_share
from gmlx_server.config.sampling import SAMPLING_KNOBS
from gmlx_server.config.service_entries import check_service_refs, parse_services
from gmlx_server.config.settings import (
    BACKENDS,
    BUILTIN_INTENTS,
    DEFAULT_TOOL_PROMPT_BUDGET,
    EFFORT_LEVELS,
    PRIORITIES,
    PRIORITY_LIMIT,
    REASONING_FORMATS,
    TOOL_FORMATS,
    ConfigError,
    KVQuant,
    KVQuantError,
    ModelEntry,
    Profile,
    ServerConfig,
    ServerSettings,
    default_prompt_cache_dir,
)
from gmlx_server.web_policy import fetch_host_list, host_list, origin_list

_SERVER_KINDS = {
    "host": "str", "port": "int", "api_key": "str", "default_model": "str", "models_dir": "str",
    "hf_cache": "bool", "idle_timeout_s": "number", "decode_batch": "int", "memory_budget": "any",
    "prompt_cache_bytes": "any", "prompt_cache_dir": "str", "prompt_cache_disk_bytes": "any",
    "clamp_max_tokens": "bool", "allowed_origins": "any", "allowed_hosts": "any",
    "image_fetch": "bool", "image_fetch_timeout_s": "number", "image_max_bytes": "any",
    "image_fetch_allow_private": "bool", "image_fetch_allowed_hosts": "any", "api_keys": "any", "fair_share": "any",
    "default_max_tokens": "int",
}
_MODEL_KINDS = {
    "path": "str", "profile": "str", "max_kv_size": "int", "pinned": "bool", "chat_template": "str",
    "weights": "str", "clamp_max_tokens": "bool", "backend": "str", "tool_format": "str", "mmproj": "str",
    "reasoning_format": "str", "default_max_tokens": "int", "tool_prompt_budget": "number", "kv_dtype": "str",
}
_KV_QUANT_KINDS = {"scheme": "str", "bits": "int", "group_size": "int", "value_bits": "int", "tail_tokens": "int"}
_CHECKER_KINDS = {"number": "number", "integer": "int", "boolean": "bool"}  # a knob's JSON kind, as Checker says it
_PROFILE_KEYS = frozenset({"intent", "system", "chat_template_kwargs", "max_tokens", "stop", "priority",
                           *SAMPLING_KNOBS})
_TOP_KEYS = frozenset({"server", "models", "profiles", "aliases", "services", "mcp_servers", "assistants"})


def _server(c: Checker, raw: Any) -> ServerSettings:
    data = c.section(raw, "server", frozenset(_SERVER_KINDS))
    d = ServerSettings()
    kw = {k: c.value(data, "server", k, kind, getattr(d, k))
          for k, kind in _SERVER_KINDS.items() if kind != "any"}
    kw["memory_budget"] = c.size(data.get("memory_budget"), "server.memory_budget")
    kw["prompt_cache_bytes"] = _cache_bytes(c, data.get("prompt_cache_bytes", d.prompt_cache_bytes))
    kw.update(_disk_tier(c, data, kw["prompt_cache_dir"], kw["prompt_cache_bytes"]))
    if kw["decode_batch"] < 1:
        raise c.fail("server.decode_batch", "must be at least 1")
    if kw["default_max_tokens"] < 1:
        raise c.fail("server.default_max_tokens", "must be at least 1")
    if kw["port"] > 65535:
        raise c.fail("server.port", f"must be 0 to 65535, got {kw['port']}")
    if kw["models_dir"] is not None:
        kw["models_dir"] = c.path(kw["models_dir"], "server.models_dir", Path(c.source).parent)
    kw["idle_timeout_s"] = float(kw["idle_timeout_s"])
    kw["image_fetch_timeout_s"] = float(kw["image_fetch_timeout_s"])
    if kw["image_fetch_timeout_s"] <= 0:
        raise c.fail("server.image_fetch_timeout_s", "must be more than 0")
    kw["image_max_bytes"] = c.size(data.get("image_max_bytes"), "server.image_max_bytes") or d.image_max_bytes
    kw["allowed_origins"] = c.name_list(data, "server.allowed_origins", origin_list)
    kw["allowed_hosts"] = c.name_list(data, "server.allowed_hosts", host_list)
    kw["image_fetch_allowed_hosts"] = c.name_list(data, "server.image_fetch_allowed_hosts", fetch_host_list)
    kw["api_keys"] = parse_api_keys(c, data.get("api_keys"))
    kw["fair_share"] = parse_fair_share(c, data.get("fair_share"), "server.fair_share")
    return ServerSettings(**kw)


def _disk_tier(c: Checker, data: Mapping[str, Any], where: str | None, ram_bytes: int) -> dict[str, Any]:
    """server.prompt_cache_disk_bytes (0, the default: off) and the directory it bounds."""
    raw = data.get("prompt_cache_disk_bytes", 0)
    cap = (c.size(raw, "server.prompt_cache_disk_bytes") or 0) if raw else 0
    if cap and not ram_bytes:
        raise c.fail("server.prompt_cache_disk_bytes", "needs the RAM prompt cache: server.prompt_cache_bytes is 0")
    root = (c.path(where, "server.prompt_cache_dir", Path(c.source).parent, must_exist=False)
            if where is not None else str(default_prompt_cache_dir()))
    return {"prompt_cache_disk_bytes": cap, "prompt_cache_dir": root}


def _cache_bytes(c: Checker, v: Any) -> int:
    if v == 0 or v is False:
        return 0
    size = None if v == "auto" else c.size(v, "server.prompt_cache_bytes")
    if size is None:
        raise c.fail("server.prompt_cache_bytes", "expected bytes or a size like 512MiB (0 disables)")
    return size


def _model(c: Checker, mid: str, raw: Any, base: Path, drafts: RawDrafts) -> ModelEntry:
    """The entry without its Draft: `drafts` collects the draft keys, resolved once every id is known."""
    key = f"models.{mid}"
    data = c.section(raw, key, frozenset(_MODEL_KINDS) | {"kv_quant"} | DRAFT_KEYS
                     | {"reasoning_budgets"})
    draft = raw_draft(c, data, key)
    if draft is not None:
        drafts[mid] = draft
    kw = {k: c.value(data, key, k, kind) for k, kind in _MODEL_KINDS.items()}
    kw["kv_quant"] = _kv_quant(c, data.get("kv_quant"), f"{key}.kv_quant")
    if kw["path"] is None:
        raise c.fail(f"{key}.path", "missing (a GGUF file, hf:org/repo/file.gguf or a local MLX dir)")
    kw["path"] = c.path(kw["path"], f"{key}.path", base, repo_ok=True)
    if Path(kw["path"]).is_dir():
        _refuse_for_dir(c, key, kw)  # (a draft is refused by its own check, which names the path)
    if kw["mmproj"] is not None:
        kw["mmproj"] = c.path(kw["mmproj"], f"{key}.mmproj", base)
        if draft is not None:
            raise c.fail(f"{key}.draft", "a vision model (mmproj) cannot speculate: the drafter never sees images")
    tpl = kw["chat_template"]
    if tpl is not None and "{{" not in tpl and "{%" not in tpl:
        kw["chat_template"] = c.path(tpl, f"{key}.chat_template", base)  # a file, not inline jinja
    for name in ("max_kv_size", "default_max_tokens"):
        if kw[name] is not None and kw[name] < 1:
            raise c.fail(f"{key}.{name}", "must be at least 1")
    kw["weights"] = kw["weights"] or "auto"
    if kw["weights"] not in LAYOUT_CHOICES:
        raise c.fail(f"{key}.weights", f"expected one of {', '.join(LAYOUT_CHOICES)}, got {kw['weights']!r}")
    kw["kv_dtype"] = kw["kv_dtype"] or "auto"
    if kw["kv_dtype"] not in KV_DTYPE_CHOICES:
        raise c.fail(f"{key}.kv_dtype", f"expected one of {', '.join(KV_DTYPE_CHOICES)}, got {kw['kv_dtype']!r}")
    kw["tool_format"] = kw["tool_format"] or "auto"
    if kw["tool_format"] not in TOOL_FORMATS:
        raise c.fail(f"{key}.tool_format", f"expected {', '.join(TOOL_FORMATS)}, got {kw['tool_format']!r}")
    kw["reasoning_format"] = kw["reasoning_format"] or "parsed"
    if kw["reasoning_format"] not in REASONING_FORMATS:
        raise c.fail(f"{key}.reasoning_format", f"expected parsed or raw, got {kw['reasoning_format']!r}")
    share = kw["tool_prompt_budget"]
    if share is not None and not 0 < share <= 1:
        raise c.fail(f"{key}.tool_prompt_budget", f"must be more than 0 and at most 1, got {share}")
    kw["tool_prompt_budget"] = float(share) if share is not None else DEFAULT_TOOL_PROMPT_BUDGET
    kw["reasoning_budgets"] = _reasoning_budgets(c, data.get("reasoning_budgets"), f"{key}.reasoning_budgets")
    kw["backend"] = kw["backend"] or BACKENDS[0]
    if kw["backend"] not in BACKENDS:
        raise c.fail(f"{key}.backend", f"expected one of {', '.join(BACKENDS)}, got {kw['backend']!r}")
    kw["pinned"] = bool(kw["pinned"])
    return ModelEntry(id=mid, **kw)


def _reasoning_budgets(c: Checker, raw: Any, key: str) -> Mapping[str, int | None] | None:
    """{low: N, medium: N, high: N}: thinking tokens per reasoning_effort (null: no cap); unnamed levels keep
    their defaults."""
    if raw is None:
        return None
    data = c.section(raw, key, frozenset(EFFORT_LEVELS))
    return MappingProxyType({k: c.value(data, key, k, "int") for k in EFFORT_LEVELS if k in data})


def _refuse_for_dir(c: Checker, key: str, kw: Mapping[str, Any]) -> None:
    """A model directory loads through mlx-vlm's loader, which takes none of the GGUF path's options."""
    given = {"mmproj": kw["mmproj"] is not None, "kv_quant": kw["kv_quant"] is not None,
             "weights": kw["weights"] not in (None, "auto"), "kv_dtype": kw["kv_dtype"] not in (None, "auto")}
    for name, present in given.items():
        if present:
            raise c.fail(f"{key}.{name}", "not for a model directory (mlx-vlm's loader brings its own weights and "
                                          "vision tower); it applies to GGUF files")


def _kv_quant(c: Checker, raw: Any, key: str) -> KVQuant | None:
    """{scheme: uniform, bits, group_size} or {scheme: kvarn, bits, group_size, value_bits, tail_tokens}."""
    if raw is None:
        return None
    data = c.section(raw, key, frozenset(_KV_QUANT_KINDS))
    kw = {k: c.value(data, key, k, kind) for k, kind in _KV_QUANT_KINDS.items()}
    if kw["scheme"] not in ("uniform", "kvarn"):
        raise c.fail(f"{key}.scheme", f"expected uniform or kvarn, got {kw['scheme']!r}")
    extra = [k for k in ("value_bits", "tail_tokens") if kw[k] is not None]
    if kw["scheme"] == "uniform" and extra:
        raise c.fail(f"{key}.{extra[0]}", "only kvarn takes value_bits and tail_tokens (uniform: bits for both)")
    try:
        return KVQuant(**{k: v for k, v in kw.items() if v is not None})
    except KVQuantError as e:  # the planner's own range check, which names the field
        raise c.fail(f"{key}.{e.field}", e.what) from None


def _sampling_value(c: Checker, key: str, name: str, v: Any) -> Any:
    """A profile's knob: of the knob's kind and within the range a request's field may take."""
    knob = SAMPLING_KNOBS[name]
    kind = _CHECKER_KINDS[knob.kind]
    of_kind = isinstance(v, bool) == (kind == "bool") and isinstance(v, KINDS[kind])
    if not of_kind:
        raise c.fail(f"{key}.{name}", f"expected {kind}, got {type(v).__name__} ({v!r})")
    if kind != "bool" and not knob.admits(v):  # exact for any int: a seed may reach 2**64 - 1
        raise c.fail(f"{key}.{name}", f"must be {knob.range_text()}, got {v}")
    return v


def _profile(c: Checker, name: str, raw: Any) -> Profile:
    key = f"profiles.{name}"
    data = c.section(raw, key, _PROFILE_KEYS)
    intent = c.value(data, key, "intent", "str")
    if intent is not None and intent not in BUILTIN_INTENTS:
        raise c.fail(f"{key}.intent", f"expected one of {', '.join(BUILTIN_INTENTS)}, got {intent!r}")
    sampling = {k: _sampling_value(c, key, k, v)
                for k, v in data.items() if k in SAMPLING_KNOBS and v is not None}
    kwargs = c.section(data.get("chat_template_kwargs"), f"{key}.chat_template_kwargs")
    max_tokens = c.value(data, key, "max_tokens", "int")
    if max_tokens is not None and max_tokens < 1:
        raise c.fail(f"{key}.max_tokens", "must be at least 1")
    stop = data.get("stop") or []
    if not isinstance(stop, list) or not all(isinstance(x, str) and x for x in stop):
        raise c.fail(f"{key}.stop", "expected a list of non-empty strings")
    return Profile(name, intent, MappingProxyType(sampling), max_tokens, c.value(data, key, "system", "str"),
                   MappingProxyType(dict(kwargs)), tuple(stop), _priority(c, data.get("priority"), f"{key}.priority"))


def _priority(c: Checker, v: Any, key: str) -> int | None:
    """interactive, normal, batch, or an integer within the limit."""
    if v is None:
        return None
    if isinstance(v, str) and v in PRIORITIES:
        return PRIORITIES[v]
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) <= PRIORITY_LIMIT:
        return v
    raise c.fail(key, f"expected one of {', '.join(PRIORITIES)} or an integer within +-{PRIORITY_LIMIT}, got {v!r}")


def discover_models(models_dir: str, taken: set[str]) -> dict[str, ModelEntry]:
    """GGUF files directly under models_dir, by file stem; vision projectors (mmproj*) are not models."""
    found: dict[str, ModelEntry] = {}
    for p in sorted(Path(models_dir).glob("*.gguf")):
        if p.name.lower().startswith("mmproj") or p.stem in taken or p.stem in found:
            continue
        found[p.stem] = ModelEntry(id=p.stem, path=str(p), discovered=True)
    return found


def _check_refs(c: Checker, cfg: ServerConfig) -> None:
    profiles = set(cfg.profiles) | set(BUILTIN_INTENTS)
    for m in cfg.models.values():
        if m.profile is not None and m.profile not in profiles:
            known = ", ".join(sorted(profiles))
            raise c.fail(f"models.{m.id}.profile", f"unknown profile {m.profile!r} (known: {known})")
    for alias, target in cfg.aliases.items():
        if alias in cfg.models:
            raise c.fail(f"aliases.{alias}", "an alias cannot have the name of a model id")
        mid, _, prof = target.rpartition("@") if target not in cfg.models else (target, "", "")
        if mid not in cfg.models or (prof and prof not in profiles):
            raise c.fail(f"aliases.{alias}", f"target {target!r} is not a model id or id@profile")
    dm = cfg.server.default_model
    if dm is not None and dm not in cfg.models and dm not in cfg.aliases:
        raise c.fail("server.default_model", f"unknown model id {dm!r}")


def _yaml(source: str, text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = e.problem_mark if isinstance(e, yaml.MarkedYAMLError) else None
        problem = e.problem if isinstance(e, yaml.MarkedYAMLError) else None
        raise ConfigError(source, f"line {mark.line + 1}" if mark else "", f"invalid YAML: {problem or e}") from None


def parse(source: str, text: str, hf_cache: Path | None = None) -> ServerConfig:
    """The file's text -> a ServerConfig with no environment or command-line overrides applied yet."""
    c = Checker(source, hf_cache)
    top = c.section(_yaml(source, text), "", _TOP_KEYS)
    base = Path(source).parent
    server = _server(c, top.get("server"))
    drafts: RawDrafts = {}
    models = {str(k): _model(c, str(k), v, base, drafts) for k, v in c.section(top.get("models"), "models").items()}
    profiles = {k: _profile(c, k, v) for k, v in c.section(top.get("profiles"), "profiles").items()}
    aliases = c.section(top.get("aliases"), "aliases")
    for k, v in aliases.items():
        if not isinstance(v, str) or not v:
            raise c.fail(f"aliases.{k}", f"expected a model id or id@profile, got {v!r}")
    if server.models_dir is not None:
        models.update(discover_models(server.models_dir, set(models) | set(aliases)))
    if not models:
        raise c.fail("models", "no models configured (list some under models: or set server.models_dir)")
    models = resolve_drafts(c, models, drafts, base)
    services = MappingProxyType(parse_services(c, top.get("services"), base))
    cfg = ServerConfig(server, MappingProxyType(models), MappingProxyType(profiles),
                       MappingProxyType(dict(aliases)), services, source=source,
                       mcp_servers=MappingProxyType(parse_mcp_servers(c, top.get("mcp_servers"), base)),
                       assistants=MappingProxyType(parse_assistants(c, top.get("assistants"))))
    _check_refs(c, cfg)
    check_service_refs(c, cfg)
    check_assistant_refs(c, cfg)
    return cfg
