"""Model files the server cannot load: found from the GGUF header before a load starts, remembered until the
file changes, and answered as a typed 503 that says what is wrong with the file.

The header check reads no tensor data (a few milliseconds, a fraction of a second on a 36 GB file): a missing or
unreadable file, a file that is not GGUF (its magic), a truncated one (the byte it needs), an unknown tensor type,
an architecture or tokenizer the engine does not implement. What only a load finds (a tensor type without a
converter, a missing metadata key) is remembered the same way when the load fails. A verdict is keyed by the
file's path, size and modification time, so a fixed or replaced file is tried again; nothing else is retried.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable

from gmlx_plan.geometry import GeometryError, geometry_from_header
from gmlx_plan.gguf_header import GGUFFormatError, GGUFHeader, read_header, token_list_difference
from gmlx_server.config import ConfigError, ModelEntry, ServerConfig
from gmlx_server.engine.arch import UnsupportedArchitecture, arch_spec
from gmlx_server.engine.dir_files import dir_problem, is_model_dir
from gmlx_server.errors import GmlxError

log = logging.getLogger("gmlx.host")
FileKey = tuple[str, int, int]  # (path, size, mtime_ns); size -1 when the path cannot be read
TOKENIZER_MODELS = ("gpt2", "llama")  # what engine/tokenizer.py rebuilds from GGUF metadata


class ModelLoadFailed(GmlxError):
    """The model's file cannot be loaded. 503: the request is fine; the server cannot serve this model until
    its operator fixes the file (another host may hold a good copy)."""

    status, type = 503, "model_load_failed"


def file_key(path: str) -> FileKey:
    try:
        st = os.stat(path)
    except OSError:
        return (path, -1, -1)
    return (path, st.st_size, st.st_mtime_ns)


def file_problem(path: str) -> str | None:
    """What keeps the engine from loading `path`, from its header alone ("PATH: reason"); None if nothing."""
    if is_model_dir(path):
        return dir_problem(path)
    try:
        header = read_header(path, strings=False)  # the vocabulary's strings are not needed to judge it
        arch_spec(header)
    except (GGUFFormatError, UnsupportedArchitecture) as e:
        return str(e)
    tokenizer = header.metadata.get("tokenizer.ggml.model")
    if tokenizer not in TOKENIZER_MODELS:
        return f"{path}: unsupported tokenizer {tokenizer!r} (supported: {', '.join(TOKENIZER_MODELS)})"
    return None


def check_drafts(config: ServerConfig) -> ServerConfig:
    """The config, once each speculative model's drafter shares its target's token list (both GGUF headers
    read: blocking). A ConfigError naming the key otherwise, as the config's own checks would."""
    for target in config.models.values():
        if target.draft is None:
            continue
        key = f"models.{target.id}.draft"
        target_header = _gguf_header(config, f"models.{target.id}.path", target.path, "a speculative model")
        problem = token_list_difference(_gguf_header(config, key, target.draft.path, "a drafter"), target_header)
        if problem is not None:
            raise ConfigError(config.source or "config", key, f"the drafter must share the target's token list: "
                                                                f"{problem}")
    return config


def _gguf_header(config: ServerConfig, key: str, path: str, what: str) -> GGUFHeader:
    source = config.source or "config"
    if not path.lower().endswith(".gguf") or not os.path.isfile(path):
        raise ConfigError(source, key, f"{what} must be a local GGUF file, got {path}")
    try:
        header = read_header(path)
        geometry_from_header(header)
    except (GGUFFormatError, GeometryError) as e:
        raise ConfigError(source, key, str(e)) from None
    return header


def _about_the_file(exc: BaseException) -> str | None:
    """A load failure that retrying the same file would repeat (its format), as a reason; None otherwise
    (memory, an interrupted read: worth another try)."""
    if isinstance(exc, KeyError):
        return f"GGUF metadata key {exc} is missing"
    return str(exc) if isinstance(exc, ValueError) else None  # GGUFFormatError, unsupported types and tokenizers


class ModelFiles:
    """Per model id, the last verdict on its file. `check_headers` is off for engines whose entries name no real
    file (a test's fakes); their load failures are remembered all the same."""

    def __init__(self, check_headers: bool) -> None:
        self.check_headers = check_headers
        self._failed: dict[str, tuple[FileKey, ModelLoadFailed]] = {}
        self._good: dict[str, FileKey] = {}
        self._lock = threading.Lock()  # verify runs in worker threads

    def verify(self, entry: ModelEntry) -> None:
        """Raise the model's ModelLoadFailed if its file is known bad or fails the header check. Blocking (a stat,
        at most one header read): call it from a thread. `entry.path` is the local file the factory will read."""
        key = file_key(entry.path)
        with self._lock:
            known = self._failed.get(entry.id)
            if known is not None and known[0] == key:
                raise known[1]
            if not self.check_headers or self._good.get(entry.id) == key:
                return
        problem = file_problem(entry.path)
        if problem is not None:
            raise self._remember(entry.id, key, problem)
        with self._lock:
            self._good[entry.id] = key

    def load_failed(self, entry: ModelEntry, exc: BaseException) -> ModelLoadFailed:
        """The factory's exception as the typed error; remembered when it is about the file."""
        reason = _about_the_file(exc)
        if reason is None:
            log.error("model %s failed to load", entry.id, exc_info=exc)
            return ModelLoadFailed(f"model '{entry.id}' failed to load: {exc}", param="model")
        path = entry.path
        return self._remember(entry.id, file_key(path), reason if reason.startswith(path) else f"{path}: {reason}")

    def _remember(self, model_id: str, key: FileKey, problem: str) -> ModelLoadFailed:
        log.error("model %s cannot be loaded: %s (not retried until the file changes)", model_id, problem)
        err = ModelLoadFailed(f"model '{model_id}' cannot be loaded: {problem}", param="model",
                              code="model_file_invalid", extra={"model": model_id})
        with self._lock:
            self._failed[model_id] = (key, err)
            self._good.pop(model_id, None)
        return err

    def problem(self, model_id: str) -> str | None:
        """The remembered reason a model cannot load, while its file is unchanged (a stat: cheap enough for
        /health). A changed file is forgotten, so the next load checks it again."""
        with self._lock:
            known = self._failed.get(model_id)
        if known is None:
            return None
        if file_key(known[0][0]) != known[0]:
            with self._lock:
                self._failed.pop(model_id, None)
            return None
        return known[1].message

    def forget(self, model_ids: Iterable[str]) -> None:
        with self._lock:
            for model_id in model_ids:
                self._failed.pop(model_id, None)
                self._good.pop(model_id, None)
