"""A speculative model's drafter in the memory model: its weights and unquantized KV (k tokens past each
stream's depth) count in the capacity table, and `gmlx plan` (flags or the config's draft:) builds the same
table as the server's capacity service."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gmlx_plan.cli import main
from gmlx_plan.gguf_header import read_header
from gmlx_plan.memory import (
    KV_DTYPE_BYTES,
    KVQuant,
    kv_bytes,
    kv_bytes_per_token,
    model_from_header,
    model_with_draft,
    need_bytes,
    transient_bytes,
)
from gmlx_server.config import load_config
from gmlx_server.engine.layout import kv_dtype
from gmlx_server.serving.capacity import CapacityService
from tests.conftest import smollm2_path


def test_a_drafter_adds_its_weights_and_kv() -> None:
    header = read_header(smollm2_path(), strings=False)
    target = model_from_header(header, "dense", KVQuant("uniform", 8, 64))
    draft = model_from_header(header, "packed")
    m = model_with_draft(target, header, "packed", "smol", 3)
    assert m.weights_bytes == target.weights_bytes + draft.weights_bytes
    assert m.draft is not None and (m.draft.name, m.draft.tokens, m.draft.model.kv_quant) == ("smol", 3, None)
    assert kv_bytes_per_token(m) == kv_bytes_per_token(target) + kv_bytes_per_token(draft)
    for depth in (1, 253, 254, 1000):  # 253 + 3 stays in the first 256-token step, 254 + 3 does not
        assert kv_bytes(m, depth) == kv_bytes(target, depth + 3) + kv_bytes(draft, depth + 3)
    assert kv_bytes(m, 254) > kv_bytes(m, 253) and kv_bytes(m, 0) == 0
    assert transient_bytes(m, 512, 2048) == max(transient_bytes(target, 512, 2048), transient_bytes(draft, 512, 2048))
    assert need_bytes(m, 300, 20) > need_bytes(target, 300, 20)


def _plan(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    rc = main(["plan", "--width", "1", "--depth", "1024", "--memory", "1GiB", "--json", *argv])
    assert rc in (0, 1)
    cap: dict[str, Any] = json.loads(capsys.readouterr().out)["capacity"]
    return cap


def test_plan_flags_budget_the_drafter(capsys: pytest.CaptureFixture[str]) -> None:
    plain = _plan(capsys, "--model", smollm2_path(), "--layout", "dense")
    spec = _plan(capsys, "--model", smollm2_path(), "--layout", "dense", "--draft", smollm2_path(),
                 "--draft-tokens", "5")
    stem = Path(smollm2_path()).stem
    assert plain["draft"] is None and isinstance(spec["draft"], dict)
    assert spec["draft"]["model"] == stem and spec["draft"]["draft_tokens"] == 5
    assert spec["weights_bytes"] == plain["weights_bytes"] + spec["draft"]["weights_bytes"]
    assert spec["kv_bytes_per_token"] == 2 * plain["kv_bytes_per_token"]
    assert spec["max_ctx"]["1"] < plain["max_ctx"]["1"]


CONFIG = """server:
  memory_budget: 1073741824
  decode_batch: 2
  default_model: coder
models:
  smol:
    path: {path}
    weights: packed
  coder:
    path: {path}
    weights: dense
    kv_quant: {{scheme: uniform, bits: 8}}
    draft: smol
    draft_tokens: 3
"""


def test_the_config_draft_plans_as_the_server_budgets(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "gmlx.yaml"
    cfg.write_text(CONFIG.format(path=smollm2_path()))
    planned = _plan(capsys, "--config", str(cfg), "--model", "coder")
    packed = model_from_header(read_header(smollm2_path(), strings=False), "packed")
    e = KV_DTYPE_BYTES[kv_dtype("auto")]  # the server's auto: float16 where the CPU kernels attend
    assert planned["draft"] == {"model": "smol", "draft_tokens": 3, "weights_bytes": packed.weights_bytes,
                                "kv_bytes_per_token": 30 * 3 * (64 + 64) * e}  # unquantized, 30 layers
    served = CapacityService(load_config(str(cfg))).section()
    assert served == planned  # field for field, the drafter included
    assert _plan(capsys, "--config", str(cfg), "--model", "coder", "--draft", "none")["draft"] is None
    assert _plan(capsys, "--config", str(cfg), "--model", "coder", "--draft-tokens", "6")["draft"]["draft_tokens"] == 6
