"""The services: section -> ServiceEntry per kind; every key is checked by name, systemone is refused."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gmlx_server.config.checker import Checker
from gmlx_server.config.settings import ServerConfig, ServiceEntry

KINDS = ("embeddings", "rerank", "stt", "tts")
UNBUILT = {"systemone": "structured decisions need a DiffusionGemma model, and none is available to this build"}
_COMMON = {"id": "str", "model": "str", "load": "str", "max_concurrent": "int"}
# Each kind's own keys: (kind of value, default).
OPTIONS: dict[str, dict[str, tuple[str, Any]]] = {
    "embeddings": {"max_batch": ("int", 32), "max_inputs": ("int", 2048), "matryoshka": ("bool", False)},
    "rerank": {"method": ("str", "cosine"), "max_documents": ("int", 1000)},
    "stt": {"max_audio_s": ("number", 1800), "max_file_bytes": ("any", 25 << 20), "compute_type": ("str", "auto")},
    "tts": {"max_input_chars": ("int", 4096)},
}
RERANK_METHODS = ("cosine", "llm")
LOAD_MODES = ("first_use", "start")


def parse_services(c: Checker, raw: Any, base: Path) -> dict[str, ServiceEntry]:
    data = c.section(raw, "services", frozenset(KINDS) | frozenset(UNBUILT))
    for name, why in UNBUILT.items():
        if data.get(name) is not None:
            raise c.fail(f"services.{name}", f"not available ({why}); remove this key")
    return {kind: _entry(c, kind, data[kind], base) for kind in KINDS if data.get(kind) is not None}


def _entry(c: Checker, kind: str, raw: Any, base: Path) -> ServiceEntry:
    key = f"services.{kind}"
    own = OPTIONS[kind]
    data = c.section(raw, key, frozenset(_COMMON) | frozenset(own) | {"aliases"})
    kw = {k: c.value(data, key, k, kind_) for k, kind_ in _COMMON.items()}
    options = {k: (c.value(data, key, k, t, d) if t != "any" else data.get(k, d)) for k, (t, d) in own.items()}
    if kind == "stt":
        options["max_file_bytes"] = c.size(options["max_file_bytes"], f"{key}.max_file_bytes")
    for name, value in options.items():
        if isinstance(value, int | float) and not isinstance(value, bool) and value <= 0:
            raise c.fail(f"{key}.{name}", f"must be positive, got {value}")
    load = kw["load"] or "first_use"
    if load not in LOAD_MODES:
        raise c.fail(f"{key}.load", f"expected first_use or start, got {load!r}")
    concurrent = kw["max_concurrent"] if kw["max_concurrent"] is not None else 4
    if concurrent < 1:
        raise c.fail(f"{key}.max_concurrent", "must be at least 1")
    aliases = c.name_list(data, f"{key}.aliases", lambda xs: tuple(x for x in xs if x))
    model = _model(c, kind, kw["model"], options, base)
    return ServiceEntry(kind=kind, id=kw["id"] or kind, model=model, aliases=aliases, load=load,
                        max_concurrent=concurrent, options=MappingProxyType(options))


def _model(c: Checker, kind: str, raw: str | None, options: Mapping[str, Any], base: Path) -> str | None:
    key = f"services.{kind}.model"
    if kind == "rerank":
        method = options["method"]
        if method == "cross-encoder":
            raise c.fail("services.rerank.method", "cross-encoder is not built (no cross-encoder model is "
                                                   "available to test it); use cosine or llm")
        if method not in RERANK_METHODS:
            raise c.fail("services.rerank.method", f"expected cosine or llm, got {method!r}")
        if method == "llm":
            if raw is None:
                raise c.fail(key, "missing: the llm method scores with a chat model; name its id under models:")
            return raw  # a chat model id, checked once models: is read
    if raw is None:
        if kind == "rerank":
            return None  # cosine on the embeddings service's model
        raise c.fail(key, "missing (a local path, pkg:<package>/<path> or hf:org/repo)")
    return model_source(c, raw, key, base)


def model_source(c: Checker, raw: str, key: str, base: Path) -> str:
    """hf: refs stay as written (the server downloads them in the background); pkg: and local paths resolve."""
    if raw.startswith("hf:"):
        parts = raw[3:].strip("/").split("/")
        if len(parts) < 2 or not all(parts):
            raise c.fail(key, f"expected hf:org/repo or hf:org/repo/path/inside, got {raw!r}")
        return raw
    if raw.startswith("pkg:"):
        package, _, inner = raw[4:].partition("/")
        spec = importlib.util.find_spec(package) if package.isidentifier() else None  # never imported
        if spec is None or not spec.submodule_search_locations:
            raise c.fail(key, f"package {package!r} is not installed (pip install --no-deps "
                              f"{package.replace('_', '-')})")
        raw = str(Path(next(iter(spec.submodule_search_locations))) / inner)
    return c.path(raw, key, base)


def check_service_refs(c: Checker, cfg: ServerConfig) -> None:
    """Service ids are unique beside the chat ids; rerank's llm model is a chat model, cosine needs embeddings."""
    taken: dict[str, str] = {name: "models" for name in cfg.models} | {name: "aliases" for name in cfg.aliases}
    for kind, entry in cfg.services.items():
        for name in (entry.id, *entry.aliases):
            if name in taken:
                raise c.fail(f"services.{kind}", f"the name {name!r} is already used under {taken[name]}")
            taken[name] = f"services.{kind}"
    rerank = cfg.services.get("rerank")
    if rerank is None:
        return
    if rerank.options["method"] == "llm" and rerank.model not in cfg.models:
        raise c.fail("services.rerank.model", f"{rerank.model!r} is not a model id under models:")
    if rerank.options["method"] == "cosine" and rerank.model is None and "embeddings" not in cfg.services:
        raise c.fail("services.rerank.model", "missing: cosine needs a model path or a services.embeddings entry")
