"""The prompt cache's disk tier on real servers and the real SmolLM2, through the official SDKs: a session's
prefix survives another process, a restart, an unload and a /v1/reload, and the greedy answer after a disk
restore is the cold answer; the 8-bit KV model's files stay packed; bad files and a tiny cap cost no request."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import mlx.core as mx
import pytest

from gmlx_plan.pace import prefill_from_json
from tests.conftest import smollm2_path
from tests.e2e.server import LiveServer, anthropic_client, gmlx_serve, openai_client
from tests.e2e.test_prompt_cache import SYSTEM

pytestmark = pytest.mark.slow
N = 8
GREEDY = {"temperature": 0}
FIRST = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What happened at dawn?"}]


def _config(tmp_path: Path, cap: str = "256MiB", models: tuple[str, ...] = ("smollm2", "q8")) -> Path:
    entries = {"smollm2": f"  smollm2:\n    path: {smollm2_path()}\n",
               "q8": f"  q8:\n    path: {smollm2_path()}\n    kv_quant: {{scheme: uniform, bits: 8}}\n"}
    cfg = tmp_path / "gmlx.yaml"
    cfg.write_text(f"server:\n  prompt_cache_disk_bytes: {cap}\n  prompt_cache_dir: {tmp_path / 'pc'}\n"
                   "models:\n" + "".join(entries[m] for m in models))
    return cfg


def _turn(s: LiveServer, messages: list[dict[str, str]], model: str = "smollm2") -> tuple[str, str]:
    """(the greedy answer, the tier its cached tokens came from, as the request log says)."""
    reply = openai_client(s).chat.completions.create(model=model, messages=messages,  # type: ignore[arg-type]
                                                     max_tokens=N, temperature=0)
    return reply.choices[0].message.content or "", _logged_tier(s, reply.id)


def _logged_tier(s: LiveServer, request_id: str) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        line = next((ln for ln in s.log().splitlines() if f"request id={request_id} " in ln), None)
        if line is not None:
            found = re.search(r" cache=(\w+)", line)
            return found.group(1) if found else "miss"
        time.sleep(0.05)
    raise AssertionError(f"no request log line for {request_id}")


def _settled(s: LiveServer) -> dict[str, Any]:
    """The cache stats once every queued disk write of the resident models has landed."""
    deadline = time.monotonic() + 30
    while True:
        body: dict[str, Any] = httpx.get(s.v1 + "/cache/stats", timeout=10).json()
        pending = [m["disk"]["writes_pending"] for m in body.get("models", {}).values()]
        if not any(pending) or time.monotonic() > deadline:
            return body
        time.sleep(0.05)


def _post(s: LiveServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(s.base_url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


@pytest.fixture(scope="module")
def second_turn() -> list[dict[str, str]]:
    return [*FIRST, {"role": "assistant", "content": "The lamp was lit."}, {"role": "user", "content": "Dusk?"}]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, LiveServer, LiveServer]]:
    """Two servers on one config, so one disk directory."""
    tmp = tmp_path_factory.mktemp("disk")
    cfg = _config(tmp)
    with gmlx_serve(["--config", str(cfg)], tmp) as a, gmlx_serve(["--config", str(cfg)], tmp) as b:
        yield cfg, a, b


def test_a_session_survives_another_process_a_restart_an_unload_and_a_reload(
        pair: tuple[Path, LiveServer, LiveServer], second_turn: list[dict[str, str]], tmp_path: Path) -> None:
    cfg, a, b = pair
    assert _turn(a, FIRST)[1] == "miss"
    assert _settled(a)["disk"]["entries"] >= 1
    shared, tier = _turn(b, second_turn)  # b never saw the first turn: its prefix comes from a's file
    assert tier == "disk"
    assert _post(b, "/v1/cache/reset", {})["disk_entries_removed"] >= 1
    cold, tier = _turn(b, second_turn)
    assert tier == "miss" and shared == cold  # greedy: the restored KV gives the cold answer
    _settled(b)
    with gmlx_serve(["--config", str(cfg)], tmp_path) as restarted:
        unloaded = _post(restarted, "/v1/estimate", {"model": "smollm2", "messages": second_turn})
        _post(restarted, "/v1/keep", {"model": "smollm2", "warm": False})
        est = _post(restarted, "/v1/estimate", {"model": "smollm2", "messages": second_turn})
        assert est["cache_tier"] == "disk" and est["warm_tokens"] > 500 and not unloaded["resident"]
        assert (unloaded["cache_tier"], unloaded["warm_tokens"]) == ("disk", est["warm_tokens"])  # from the headers
        assert _turn(restarted, second_turn) == (cold, "disk")
        stats = _settled(restarted)["models"]["smollm2"]
        assert stats["hits"]["disk"] == 1 and stats["disk"]["restored_tokens"] == est["warm_tokens"]
        _assert_a_disk_hit_is_estimated_at_the_disk_pace(restarted, second_turn)
        assert _post(restarted, "/unload", {"model": "smollm2"})["status"] == "ok"
        assert _turn(restarted, second_turn) == (cold, "disk")  # unloaded, RAM gone: the disk still has it
    _assert_reload_restores(a, cfg, second_turn, cold)


def _assert_a_disk_hit_is_estimated_at_the_disk_pace(s: LiveServer, turn: list[dict[str, str]]) -> None:
    """The disk read was timed apart from RAM restores; with RAM emptied, the estimate is that read, then the
    cold tail at the prefill pace (an idle server: no queue ahead)."""
    paces = httpx.get(s.v1 + "/metrics", timeout=10).json()["server"]["rates"]["by_model"]["smollm2"]
    assert paces["disk_restore_tok_s"] and paces["restore_tok_s"] is None  # no RAM hit yet: nothing timed there
    _post(s, "/v1/cache/reset", {"tier": "ram"})
    est = _post(s, "/v1/estimate", {"model": "smollm2", "messages": turn})
    prompt, warm = est["prompt_tokens"], min(est["warm_tokens"], est["prompt_tokens"] - 1)
    pace = prefill_from_json(paces)
    assert pace is not None
    cold = pace.seconds(warm, prompt)
    assert est["cache_tier"] == "disk" and warm > 500
    assert est["est_ttft_s"] == pytest.approx(warm / paces["disk_restore_tok_s"] + cold, abs=0.003), (est, paces)


def _assert_reload_restores(s: LiveServer, cfg: Path, turn: list[dict[str, str]], cold: str) -> None:
    """A reload that drops the model and one that brings it back build a new engine: its first turn is a disk hit."""
    text = cfg.read_text()
    cfg.write_text(re.sub(r"  smollm2:\n    path: [^\n]+\n", "", text))
    try:
        dropped = _post(s, "/v1/reload", {})
        assert dropped["status"] == "reloaded" and dropped["removed"] == ["smollm2"]
    finally:
        cfg.write_text(text)
    assert _post(s, "/v1/reload", {})["added"] == ["smollm2"]
    assert _turn(s, turn) == (cold, "disk")


def test_the_8_bit_kv_model_restores_packed_through_the_anthropic_sdk(
        pair: tuple[Path, LiveServer, LiveServer], second_turn: list[dict[str, str]]) -> None:
    cfg, a, _ = pair
    client = anthropic_client(a)

    def ask() -> tuple[str, int]:
        reply = client.messages.create(model="q8", system=SYSTEM, messages=second_turn[1:],  # type: ignore[arg-type]
                                       max_tokens=N, extra_body=GREEDY)
        block = reply.content[0]
        assert block.type == "text"
        return block.text, reply.usage.cache_read_input_tokens or 0

    client.messages.create(model="q8", system=SYSTEM, messages=FIRST[1:], max_tokens=N,  # type: ignore[arg-type]
                           extra_body=GREEDY)
    _settled(a)
    _post(a, "/v1/cache/reset", {"model": "q8", "tier": "ram"})
    warm, cached = ask()
    assert cached > 500 and _settled(a)["models"]["q8"]["hits"]["disk"] == 1
    _post(a, "/v1/cache/reset", {"model": "q8"})
    assert ask() == (warm, 0)
    assert _packed(cfg.parent / "pc", "q8") > 0 and _packed(cfg.parent / "pc", "smollm2") == 0


def _packed(root: Path, model: str) -> int:
    """Quantized layers in `model`'s files, each checked to hold its keys as packed uint32 words."""
    n = 0
    for path in root.glob("*.kv.safetensors"):
        arrays, meta = mx.load(str(path), return_metadata=True)
        assert isinstance(arrays, dict) and isinstance(meta, dict)
        header = json.loads(str(meta["gmlx"]))
        if header["model"] != model:
            continue
        quantized = [i for i, (kind, _, _) in enumerate(header["layers"]) if kind == "q"]
        assert all(arrays[f"{i}.0"].dtype == mx.uint32 for i in quantized)
        n += len(quantized)
    return n


def test_bad_files_and_a_tiny_cap_cost_no_request(tmp_path: Path, second_turn: list[dict[str, str]]) -> None:
    cfg = _config(tmp_path, cap="64KiB", models=("smollm2",))  # far below one snapshot: every write is dropped
    root = tmp_path / "pc"
    root.mkdir(mode=0o700)
    (root / ("0" * 40 + ".kv.safetensors")).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json")
    (root / ("1" * 40 + ".kv.safetensors")).write_bytes(b"")
    with gmlx_serve(["--config", str(cfg)], tmp_path) as s:
        assert _turn(s, FIRST)[1] == "miss"
        assert _turn(s, second_turn)[1] != "disk"
        disk = _settled(s)["models"]["smollm2"]["disk"]
        assert disk["removed_bad"] == 2 and disk["writes"] == 0 and disk["writes_dropped"] >= 2
        assert not list(root.iterdir()) and (root.stat().st_mode & 0o777) == 0o700
        assert "Traceback" not in s.log()
