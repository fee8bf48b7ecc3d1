"""Where a plan's inputs come from: a GGUF path or a configured id, the config's server settings,
the --kv-quant flag, and a running server's rates. Reads the YAML minimally (no gmlx_server import).
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gmlx_plan.budget import parse_disk_cap, parse_memory
from gmlx_plan.memory import DEFAULT_DRAFT_TOKENS, KVQuant
from gmlx_plan.pace import Paces, paces_from_json


class PlanInputError(ValueError):
    """An input the operator gave cannot be used; the message says which and why."""


@dataclass(frozen=True)
class ModelSource:
    model_id: str
    path: str
    decode_batch: int | None = None  # server.decode_batch
    memory_budget: int | None = None  # server.memory_budget (None = auto)
    max_kv_size: int | None = None
    kv_quant: KVQuant | None = None
    layout: str | None = None  # models.<id>.weights: auto, packed or dense
    kv_dtype: str | None = None  # models.<id>.kv_dtype: auto, float32 or float16
    draft: DraftSource | None = None  # models.<id>.draft
    disk_cache_bytes: int = 0  # server.prompt_cache_disk_bytes (0: the disk tier is off)


@dataclass(frozen=True)
class DraftSource:
    """A speculative model's drafter, as the server resolves `draft:` (hf: refs aside: the planner reads files)."""

    name: str
    path: str
    tokens: int = DEFAULT_DRAFT_TOKENS
    layout: str | None = None  # the named entry's weights; auto for a file


def parse_kv_quant(spec: str | None) -> KVQuant | None:
    """'none', 'uniform:BITS[:GROUP]' or 'kvarn:KEY_BITS:VALUE_BITS:TAIL_TOKENS[:GROUP]'."""
    if spec is None or spec.strip().lower() in ("", "none", "fp16"):
        return None
    scheme, *parts = spec.strip().lower().split(":")
    try:
        nums = [int(p) for p in parts]
        if scheme == "uniform" and len(nums) <= 2:
            full = nums + [4, 64][len(nums):]  # defaults: the config's bits 4, group 64
            return KVQuant("uniform", full[0], full[1])
        if scheme == "kvarn" and 3 <= len(nums) <= 4:
            return KVQuant("kvarn", nums[0], nums[3] if len(nums) == 4 else 64, nums[1], nums[2])
    except ValueError as e:
        raise PlanInputError(f"--kv-quant {spec!r}: {e}") from e
    raise PlanInputError(f"--kv-quant {spec!r}: expected none, uniform:BITS[:GROUP] or "
                         "kvarn:KEY_BITS:VALUE_BITS:TAIL_TOKENS[:GROUP]")


def _kv_from_config(raw: Any) -> KVQuant | None:
    if not isinstance(raw, dict):
        return None
    try:
        return KVQuant(raw.get("scheme", "uniform"), int(raw.get("bits", 4)), int(raw.get("group_size", 64)),
                       raw.get("value_bits"), raw.get("tail_tokens"))
    except (TypeError, ValueError) as e:
        raise PlanInputError(f"kv_quant in the config: {e}") from e


def load_yaml(config: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(config).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise PlanInputError(f"cannot read config {config}: {e}") from e
    return data if isinstance(data, dict) else {}


def _model_id(data: dict[str, Any], name: str | None) -> str:
    models, aliases = data.get("models") or {}, data.get("aliases") or {}
    name = name or (data.get("server") or {}).get("default_model")
    if not name:
        raise PlanInputError("no --model given and the config has no server.default_model")
    base = str(aliases.get(name, name)).split("@")[0]
    if base not in models:
        raise PlanInputError(f"model {name!r} is not configured (models: {', '.join(sorted(models)) or 'none'})")
    return base


def _local(raw: str, config: str, what: str) -> str:
    if not raw or raw.startswith("hf:"):
        raise PlanInputError(f"{what} {raw!r}: the planner needs a local GGUF file")
    p = Path(raw).expanduser()
    return str(p if p.is_absolute() else Path(config).parent / p)


def resolve_draft(name: str | None, tokens: int | None, config: str | None,
                  data: dict[str, Any] | None = None) -> DraftSource | None:
    """`draft:` (or --draft): a configured id's path and layout, else a GGUF path; None when `name` is None."""
    if name is None or name.lower() == "none":
        return None
    models = (data or {}).get("models") or {}
    k = DEFAULT_DRAFT_TOKENS if tokens is None else tokens
    if name in models and config:
        entry = models[name] or {}
        return DraftSource(name, _local(str(entry.get("path", "")), config, f"models.{name}.path"), k,
                           entry.get("weights"))
    if Path(name).expanduser().is_file():
        return DraftSource(Path(name).stem, str(Path(name).expanduser()), k)
    if config and not name.startswith("hf:"):
        return DraftSource(Path(name).stem, _local(name, config, "draft"), k)
    raise PlanInputError(f"draft {name!r} is neither a GGUF file nor a configured id (pass --config)")


def resolve_model(model: str | None, config: str | None) -> ModelSource:
    """A GGUF path as is; a configured id through the config's models.<id>.path (relative to the file)."""
    if model and Path(model).expanduser().is_file():
        p = Path(model).expanduser()
        return ModelSource(p.stem, str(p))
    if not config:
        raise PlanInputError(f"{model!r} is not a file; pass --config to look it up as a configured id")
    data = load_yaml(config)
    mid = _model_id(data, model)
    entry, server = data["models"][mid] or {}, data.get("server") or {}
    path = _local(str(entry.get("path", "")), config, f"models.{mid}.path")
    budget = server.get("memory_budget")
    return ModelSource(
        mid, path, decode_batch=server.get("decode_batch"),
        memory_budget=None if budget in (None, "auto") else parse_memory(budget),
        max_kv_size=entry.get("max_kv_size"), kv_quant=_kv_from_config(entry.get("kv_quant")),
        layout=entry.get("weights"), kv_dtype=entry.get("kv_dtype"),
        draft=resolve_draft(entry.get("draft"), entry.get("draft_tokens"), config, data),
        disk_cache_bytes=parse_disk_cap(server.get("prompt_cache_disk_bytes") or 0, "server.prompt_cache_disk_bytes"),
    )


def fetch_metrics(url: str, api_key: str | None = None, timeout: float = 10.0) -> dict[str, Any]:
    """GET URL/v1/metrics as JSON, the `server` object when it is wrapped in one."""
    req = urllib.request.Request(url.rstrip("/") + "/v1/metrics", headers={"Accept": "application/json"})
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = json.loads(resp.read())
    except (OSError, ValueError) as e:
        raise PlanInputError(f"cannot read {url}/v1/metrics: {e}") from e
    return data.get("server", data) if isinstance(data, dict) else {}


def model_paces(by_model: dict[str, Any], model_id: str, source: str) -> Paces | None:
    """One model's measured paces from a {model: paces} table (/v1/metrics rates.by_model, or a bench file):
    the model's own entry, or the only one there is; None when it has not measured a prefill and a step yet."""
    raw = by_model.get(model_id) or (next(iter(by_model.values())) if len(by_model) == 1 else None)
    if raw is None and by_model:
        raise PlanInputError(f"no paces for model {model_id!r} in {source} (it has: {', '.join(sorted(by_model))})")
    return paces_from_json(raw, source) if isinstance(raw, dict) else None


def paces_file(path: str, model_id: str) -> Paces:
    """--paces FILE: a bench table {model: paces}, or a saved /v1/metrics snapshot (its rates.by_model)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise PlanInputError(f"cannot read paces from {path}: {e}") from e
    server = data.get("server", data) if isinstance(data, dict) else {}
    table = (server.get("rates") or {}).get("by_model", server) if isinstance(server, dict) else {}
    paces = model_paces(table if isinstance(table, dict) else {}, model_id, path)
    if paces is None:
        raise PlanInputError(f"{path} has no measured prefill pace and decode step for {model_id!r}")
    return paces


def server_rates(metrics: dict[str, Any]) -> tuple[float, float]:
    """(decode_tok_s_recent, prefill_tok_s_recent) from /v1/metrics `rates`."""
    rates = metrics.get("rates") or {}
    decode, prefill = rates.get("decode_tok_s_recent"), rates.get("prefill_tok_s_recent")
    if not decode or not prefill:
        raise PlanInputError("the server has no recent decode/prefill rates yet; pass --decode-tok-s and "
                             "--prefill-tok-s")
    return float(decode), float(prefill)
