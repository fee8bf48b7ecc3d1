"""The server's settings as frozen dataclasses: the bottom of the server's import graph (the stdlib and the
planner's pure types only).

What each field means for an operator is in docs/configuration.md (every key and variable); how the layers use them
is in docs/architecture.md ("Where configuration lives").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from gmlx_plan.memory import DEFAULT_DRAFT_TOKENS as DEFAULT_DRAFT_TOKENS  # models.<id>.draft_tokens
from gmlx_plan.memory import MAX_DRAFT_TOKENS as MAX_DRAFT_TOKENS
from gmlx_plan.memory import KVDtypeChoice, LayoutChoice
from gmlx_plan.memory import KVQuant as KVQuant  # one definition: the planner budgets what the engine builds
from gmlx_plan.memory import KVQuantError as KVQuantError
from gmlx_server.config.assistant_entries import Assistant, McpServer

BUILTIN_INTENTS = ("chat", "coding", "creative", "precise")
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024  # room for base64 images in vision messages
SECRET_KEYS = frozenset({"api_key", "key"})  # config errors name these keys but never show their values
KeyScope = Literal["client", "admin"]
KEY_SCOPES: tuple[KeyScope, ...] = ("client", "admin")
PRIORITIES = {"interactive": -10, "normal": 0, "batch": 10}  # vLLM's sense: lower is served (and kept) first
PRIORITY_LIMIT = 1000  # an integer priority lies within +-this
LEGACY_KEY_NAME = "default"  # server.api_key / --api-key / GMLX_API_KEY: one admin key by this name
DEFAULT_MODEL_ID = "smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BLAS_OFF = frozenset({"off", "0", "none"})  # GMLX_BLAS values that keep the mlx-cpu wheel's reference BLAS
WeightsLayout = LayoutChoice  # models.<id>.weights: auto or a layout (gmlx_plan.memory names them)
# A model's tool-call syntax: its template's where it has one, else gmlx's JSON (auto); only the template's
# (template); gmlx's JSON convention always (json). README's "Tool calling on any model" says more.
ToolFormatSetting = Literal["auto", "template", "json"]
TOOL_FORMATS: tuple[ToolFormatSetting, ...] = ("auto", "template", "json")
ReasoningFormatSetting = Literal["parsed", "raw"]
REASONING_FORMATS: tuple[ReasoningFormatSetting, ...] = ("parsed", "raw")
EFFORT_LEVELS = ("low", "medium", "high")
DEFAULT_TOOL_PROMPT_BUDGET = 0.5  # the share of a window the rendered tools may take in full
# Thinking tokens per reasoning_effort where the template does not read the effort itself (None: no cap).
DEFAULT_REASONING_BUDGETS: Mapping[str, int | None] = MappingProxyType({"low": 1024, "medium": 4096, "high": None})
LogFormat = Literal["text", "json"]
DEFAULT_PROMPT_CACHE_BYTES = 512 << 20
BACKENDS = ("mlx",)  # engine backends a model entry may name (engine/factory.py has one builder per name)


class ConfigError(Exception):
    """A bad config file or environment value: names the source, the dotted key and what is wrong."""

    def __init__(self, source: str, key: str, what: str) -> None:
        self.source, self.key, self.what = source, key, what
        super().__init__(f"{source}: {key}: {what}" if key else f"{source}: {what}")



# A request that names no output cap (aider, some Codex turns) would otherwise run to the window: 30 minutes
# of a 32K window on a small CPU model, or a base model that never ends its turn. 4096 tokens holds a long
# answer or a whole file of a few hundred lines and ends in minutes; the window's room still lowers it.
DEFAULT_MAX_TOKENS = 4096

@dataclass(frozen=True)
class RuntimeEnv:
    """Environment switches, read once at start (docs/configuration.md lists each with its default)."""

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
    prompt_cache_dir: str | None = None  # the server's disk tier directory, handed to engines
    prompt_cache_disk_bytes: int = 0  # the server's disk tier cap, handed to engines (0 = off)
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
    blas: str | None = None  # GMLX_BLAS: "off" keeps the reference BLAS, a path loads that library
    native_kernels: bool = True  # GMLX_NATIVE_KERNELS=0: "auto" weights skip the CPU kernels' native layout
    log_format: LogFormat = "text"  # GMLX_LOG_FORMAT=json: one JSON object per log line (gmlx serve)



@dataclass(frozen=True)
class Draft:
    """models.<id>.draft: the drafter of a speculative model, which shares the target's token list."""

    path: str  # its local GGUF file
    model_id: str  # the configured id `draft:` names, else the file's stem
    tokens: int = DEFAULT_DRAFT_TOKENS  # models.<id>.draft_tokens: k, proposed per round
    weights: WeightsLayout = "auto"  # the named entry's layout; auto for a file


@dataclass(frozen=True)
class ModelEntry:
    id: str
    path: str
    profile: str | None = None
    max_kv_size: int | None = None
    pinned: bool = False
    mmproj: str | None = None  # a vision projector GGUF (llama.cpp's mmproj format): image input
    kv_quant: KVQuant | None = None
    kv_dtype: KVDtypeChoice = "auto"  # the unquantized KV caches' dtype (auto: float16 where the CPU kernels attend)
    draft: Draft | None = None
    chat_template: str | None = None
    weights: WeightsLayout = "auto"
    backend: str = "mlx"
    clamp_max_tokens: bool | None = None  # None: the server's setting
    default_max_tokens: int | None = None  # a cap-less request's output cap; None: server.default_max_tokens
    tool_format: ToolFormatSetting = "auto"  # read per request: a reload changes it without a new load
    reasoning_format: ReasoningFormatSetting = "parsed"  # raw: the thinking block stays in the answer's text
    reasoning_budgets: Mapping[str, int | None] | None = None  # effort -> thinking tokens; None: the defaults
    tool_prompt_budget: float = DEFAULT_TOOL_PROMPT_BUDGET  # past this share of the window, tools render compactly
    discovered: bool = False  # found under server.models_dir rather than listed in models:

    @property
    def load_key(self) -> tuple[object, ...]:
        """What the engine is built from: a reload keeps a loaded engine while this is unchanged."""
        return (self.backend, self.path, self.weights, self.max_kv_size, self.chat_template, self.kv_quant,
                self.kv_dtype, self.mmproj, self.draft)


@dataclass(frozen=True)
class Profile:
    name: str
    intent: str | None = None
    sampling: Mapping[str, Any] = field(default_factory=dict)  # SamplingParams field -> value
    max_tokens: int | None = None
    system: str | None = None
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    stop: tuple[str, ...] = ()  # added to every request's own stop strings (as Ollama's PARAMETER stop)
    priority: int | None = None  # its requests' priority unless they name one (None: normal)


@dataclass(frozen=True)
class FairShare:
    """What one caller (a key, or a client address on a key-less server) may hold at once; None: no limit."""

    max_concurrent: int | None = None  # its requests in the engine at once; the next ones wait
    max_queued: int | None = None  # its requests waiting for one of those slots; past it 429 rate_limited


@dataclass(frozen=True)
class ApiKey:
    """server.api_keys: a named key; the name is what logs, metrics and `gmlx top` show, never the key."""

    name: str
    key: str = field(repr=False)
    scope: KeyScope = "client"
    share: FairShare | None = None  # None: server.fair_share


def default_prompt_cache_dir() -> Path:
    """Where the prompt cache's disk tier lives unless server.prompt_cache_dir says: the user's cache directory."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gmlx" / "prompt-cache"


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
    prompt_cache_bytes: int = DEFAULT_PROMPT_CACHE_BYTES  # per resident model; 0 disables the prompt cache
    prompt_cache_dir: str | None = None  # the disk tier's directory; None until parsed: default_prompt_cache_dir()
    prompt_cache_disk_bytes: int = 0  # the disk tier's cap across the directory; 0 (the default) turns it off
    clamp_max_tokens: bool = False  # lower an oversized max_tokens to what the window leaves (opt-in)
    default_max_tokens: int = DEFAULT_MAX_TOKENS  # the output cap of a request that names none
    allowed_origins: tuple[str, ...] = ()  # browser origins beside the loopback ones ("*": any)
    allowed_hosts: tuple[str, ...] = ()  # Host names beside localhost and IP literals ("*": no check)
    image_fetch: bool = True  # fetch http(s) image URLs in vision messages (false: data: URIs only)
    image_fetch_timeout_s: float = 10.0  # one image URL's whole fetch, redirects and body included
    image_fetch_allow_private: bool = False  # fetch from loopback, private and other non-public addresses too
    image_fetch_allowed_hosts: tuple[str, ...] = ()  # names, addresses or networks fetched though not public
    image_max_bytes: int = 20 * 1024 * 1024  # one image's encoded size, fetched or sent inline
    api_keys: tuple[ApiKey, ...] = ()  # named, scoped keys beside api_key
    fair_share: FairShare = field(default_factory=FairShare)  # each key's (or client address's) share

    @property
    def keys(self) -> tuple[ApiKey, ...]:
        """Every key the server accepts: api_key (the admin key named "default") and server.api_keys."""
        legacy = (ApiKey(LEGACY_KEY_NAME, self.api_key, "admin"),) if self.api_key else ()
        return legacy + self.api_keys


@dataclass(frozen=True)
class ServiceEntry:
    """One entry under services: (embeddings, rerank, stt or tts); README's Services section says what each key does."""

    kind: str  # the key under services:
    id: str  # what a request's `model` names (default: the kind)
    model: str | None  # a local path, pkg:<package>/<path>, hf:org/repo[/path], or (rerank llm) a chat model id
    aliases: tuple[str, ...] = ()  # more names a request may use (whisper-1, tts-1, ...)
    load: str = "first_use"  # or "start": load in the background when the server starts
    max_concurrent: int = 4  # requests admitted at once (one runs on the worker, the rest wait); more get 503
    options: Mapping[str, Any] = field(default_factory=dict)  # the kind's own keys, checked by name


@dataclass(frozen=True)
class ServerConfig:
    server: ServerSettings = field(default_factory=ServerSettings)
    models: Mapping[str, ModelEntry] = field(default_factory=dict)
    profiles: Mapping[str, Profile] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)
    services: Mapping[str, ServiceEntry] = field(default_factory=dict)  # by kind
    mcp_servers: Mapping[str, McpServer] = field(default_factory=dict)  # by name (assistants' tools)
    assistants: Mapping[str, Assistant] = field(default_factory=dict)  # by id
    env: RuntimeEnv = field(default_factory=RuntimeEnv)
    source: str | None = None  # the YAML file; None in single-model mode

    def default_max_tokens(self, model_id: str) -> int:
        """The output cap of a request that names none (and whose profile sets no max_tokens), before the window's
        room: the model's default_max_tokens, else the server's."""
        entry = self.models.get(model_id)
        own = entry.default_max_tokens if entry is not None else None
        return own if own is not None else self.server.default_max_tokens
