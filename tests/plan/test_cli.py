"""`gmlx plan` end to end on real headers, config lookup, --server rates, memory sizes and the fast header path."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gmlx_plan.budget import cgroup_headroom, meminfo_available, parse_memory, safety_floor
from gmlx_plan.cli import main
from gmlx_plan.gguf_header import GGUFFormatError, SkippedArray, read_header
from gmlx_plan.source import PlanInputError, parse_kv_quant
from tests.conftest import gemma_path, smollm2_path
from tests.plan.header_writer import llama_tensors, write_header


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = main(["plan", *argv])
    return rc, capsys.readouterr().out


def test_plan_json_has_the_capacity_section(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _run(capsys, "--model", smollm2_path(), "--width", "4", "--depth", "4096", "--memory", "2GiB",
                   "--layout", "packed", "--kv-dtype", "f32", "--json")
    data = json.loads(out)
    assert rc == 0 and data["plan"]["ok"] is True and data["plan"]["width_read"] == 4
    cap = data["capacity"]
    assert set(cap) == {"model", "architecture", "layout", "kv_dtype_bytes", "kv_quant", "draft", "context_length",
                        "decode_batch", "prefill_chunk", "budget_bytes", "weights_bytes", "kv_bytes_per_token",
                        "kv_bytes_per_token_beyond_window", "prefill_transient_bytes", "max_ctx",
                        "max_width_at_depth"}
    assert cap["budget_bytes"] == 2 << 30 and cap["layout"] == "packed" and cap["kv_dtype_bytes"] == 4
    assert cap["max_ctx"]["1"] == 8192 and list(cap["max_ctx"]) == ["1", "2", "4", "8", "16"]
    assert data["plan"]["largest_width"] >= cap["max_width_at_depth"]["4096"] >= 4


def test_kv_dtype_comes_from_the_flag_then_the_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "gmlx.yaml"
    cfg.write_text(f"models:\n  smol:\n    path: {smollm2_path()}\n    kv_dtype: float32\n")
    base = ("--model", "smol", "--config", str(cfg), "--width", "1", "--depth", "1000", "--memory", "2GiB", "--json")
    configured = json.loads(_run(capsys, *base)[1])["capacity"]
    half = json.loads(_run(capsys, *base, "--kv-dtype", "f16")[1])["capacity"]
    assert (configured["kv_dtype_bytes"], half["kv_dtype_bytes"]) == (4, 2)
    assert 2 * half["kv_bytes_per_token"] == configured["kv_bytes_per_token"]  # every SmolLM2 layer is plain
    cfg.write_text(f"models:\n  smol:\n    path: {smollm2_path()}\n    kv_dtype: int8\n")
    rc = main(["plan", *base])
    assert rc == 2 and "kv_dtype 'int8'" in capsys.readouterr().err


def test_plan_text_says_why_not_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _run(capsys, "--model", gemma_path(), "--width", "16", "--depth", "32768", "--memory", "1500MiB",
                   "--layout", "dense", "--kv-quant", "uniform:8")
    assert rc == 1 and "NOT OK" in out and "16 streams fit at most" in out
    assert "largest width at depth 32768" in out and "uniform 8-bit" in out


def test_configured_id_reads_the_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "models" / "smol.gguf"
    model.parent.mkdir()
    model.symlink_to(smollm2_path())
    cfg = tmp_path / "gmlx.yaml"
    cfg.write_text("server:\n  decode_batch: 8\n  memory_budget: 3GiB\nmodels:\n  smol:\n    path: models/smol.gguf\n"
                   "    max_kv_size: 4096\n    weights: packed\n    kv_quant: {scheme: kvarn, bits: 4, value_bits: 8,"
                   " tail_tokens: 128}\naliases:\n  coder: smol@coding\n")
    rc, out = _run(capsys, "--model", "coder", "--config", str(cfg), "--width", "2", "--depth", "1000", "--json")
    cap = json.loads(out)["capacity"]
    assert rc == 0 and cap["model"] == "smol" and cap["decode_batch"] == 8 and cap["budget_bytes"] == 3 << 30
    assert cap["context_length"] == 4096 and cap["layout"] == "packed"
    assert cap["kv_quant"]["scheme"] == "kvarn" and cap["kv_quant"]["value_bits"] == 8
    assert "32" in cap["max_ctx"]  # 4x the decode width


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "nope", "--width", "1", "--depth", "1"], "pass --config"),
    (["--model", "x", "--width", "1", "--depth", "1", "--memory", "lots"], "not a file"),
    (["--width", "1", "--depth", "1", "--kv-quant", "uniform:7", "--memory", "1G"], "bits"),
    (["simulate", "--width", "1", "--depth", "1", "--memory", "1G"], "--decode-tok-s"),
])
def test_errors_exit_2_with_a_message(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    if "--model" not in argv:
        argv = ["--model", smollm2_path(), *argv]
    rc = main(["plan", *argv])
    assert rc == 2 and message in capsys.readouterr().err


def test_simulate_prints_a_table_and_plots(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out = _run(capsys, "simulate", "--model", smollm2_path(), "--width", "8", "--depth", "1024", "--memory",
                   "2GiB", "--layout", "packed", "--waves", "2", "--output-tokens", "64", "--think-s", "2",
                   "--spread-s", "1", "--decode-tok-s", "11", "--prefill-tok-s", "172", "--queue-cap", "1",
                   "--png", str(tmp_path / "sim.png"))
    assert rc == 0 and "503s" in out and "TTFT" in out and "drain" in out and "TTFT histogram" in out
    assert "in engine |" in out and ("PNG written" in out or "matplotlib is not installed" in out)


class _Metrics(BaseHTTPRequestHandler):
    seen: ClassVar[list[str | None]] = []  # the Authorization headers received
    paces: ClassVar[dict[str, Any]] = {}  # what rates.by_model says of the model (empty: nothing measured)

    def do_GET(self) -> None:
        _Metrics.seen.append(self.headers.get("Authorization"))
        body = json.dumps({"server": {"rates": {"decode_tok_s_recent": 9.5, "prefill_tok_s_recent": 150.0,
                                                "by_model": {"smollm2": _Metrics.paces}},
                                      "concurrency": {"decode_batch": 2, "queue_cap": 3}}}).encode()
        self.send_response(200 if self.path == "/v1/metrics" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def metrics_url() -> Iterator[str]:
    srv = HTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_simulate_reads_rates_from_a_server(metrics_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _run(capsys, "simulate", "--model", smollm2_path(), "--width", "4", "--depth", "512", "--memory",
                   "2GiB", "--server", metrics_url, "--api-key", "k", "--output-tokens", "8", "--json")
    assert rc == 0 and _Metrics.seen[-1] == "Bearer k"
    sim = json.loads(out)["simulation"]
    assert sim["completed"] == 4 and sim["slots"] == 2
    assert "decode 9.5 tok/s" not in out  # JSON mode prints no prose


MEASURED = {"prefill_tok_s": 200.0, "prefill_s_per_token": 0.005, "prefill_s_per_token_per_depth": 0.0,
            "restore_tok_s": 50000.0, "decode_step_s": {"1": 0.05, "2": 0.06}}


def test_simulate_takes_the_server_measured_paces_and_reports_the_cache_mix(
        metrics_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    _Metrics.paces = MEASURED
    argv = ("simulate", "--model", smollm2_path(), "--width", "4", "--depth", "512", "--memory", "2GiB", "--server",
            metrics_url, "--output-tokens", "8", "--json")
    try:
        rc, out = _run(capsys, *argv, "--shared-prefix", "400")
        _, cold_out = _run(capsys, *argv)
    finally:
        _Metrics.paces = {}
    sim, cold = json.loads(out)["simulation"], json.loads(cold_out)["simulation"]
    assert rc == 0 and sim["paces"]["source"] == metrics_url and sim["paces"]["decode_step_s"] == {"1": 0.05, "2": 0.06}
    # The first prompt prefills cold and is cached; the three after it restore the shared 400 tokens.
    assert sim["cache_mix"] == {"cold": 1, "warm": 3, "warm_tokens": 400}
    assert cold["cache_mix"] == {"cold": 4, "warm": 0, "warm_tokens": 0}
    # Cold, four 512-token prompts at 5 ms a token take 4 x 2.56 s of prefill; warm ones prefill 112 tokens each.
    assert cold["drain_s"] > 4 * 2.56 > sim["drain_s"] > 2.56 + 3 * 112 * 0.005


def test_simulate_reads_a_paces_table_and_says_what_it_assumed(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "paces.json"
    table.write_text(json.dumps({"smollm2": MEASURED}))
    rc, out = _run(capsys, "simulate", "--model", smollm2_path(), "--width", "2", "--depth", "300", "--memory",
                   "2GiB", "--paces", str(table), "--output-tokens", "4", "--no-prompt-cache", "--shared-prefix", "200")
    assert rc == 0 and "cache mix assumed: 2 cold, 0 warm" in out
    assert f"paces ({table}): prefill 200 tok/s at depth 0, restore 50000 tok/s" in out
    table.write_text(json.dumps({"other": MEASURED, "more": MEASURED}))
    rc, _ = _run(capsys, "simulate", "--model", smollm2_path(), "--width", "2", "--depth", "300", "--memory",
                 "2GiB", "--paces", str(table))
    assert rc == 2


@pytest.mark.parametrize(("text", "expected"), [
    ("64GiB", 64 << 30), ("24G", 24 << 30), ("512MiB", 512 << 20), ("1.5 GB", 3 << 29), ("1073741824", 1 << 30),
    (4096, 4096)])
def test_parse_memory(text: str | int, expected: int) -> None:
    assert parse_memory(text) == expected


@pytest.mark.parametrize("bad", ["", "lots", "-1G", "0", 0])
def test_parse_memory_refuses(bad: str | int) -> None:
    with pytest.raises(ValueError):
        parse_memory(bad)


def test_measured_memory_sources(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal: 100 kB\nMemAvailable:    2048 kB\n")
    assert meminfo_available(tmp_path / "meminfo") == 2 << 20
    (tmp_path / "memory.max").write_text("1000000\n")
    (tmp_path / "memory.current").write_text("400000\n")
    assert cgroup_headroom(tmp_path) == 600000
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_headroom(tmp_path) is None
    assert safety_floor(1 << 30) == 512 << 20 and safety_floor(64 << 30) == int((64 << 30) * 0.1)


def test_kv_quant_flag() -> None:
    assert parse_kv_quant("none") is None
    q = parse_kv_quant("kvarn:4:8:128")
    assert q is not None and (q.key_bits, q.val_bits, q.tail, q.group_size) == (4, 8, 128, 64)
    with pytest.raises(PlanInputError):
        parse_kv_quant("kvarn:4")


def test_header_without_strings_steps_over_the_vocabulary(tmp_path: Path) -> None:
    path = tmp_path / "v.gguf"
    meta = {"general.architecture": "llama", "llama.block_count": 1, "tokenizer.ggml.tokens": ["a", "bé", ""]}
    write_header(path, meta, llama_tensors(1, 64, 128, 64, 3))
    full, fast = read_header(path), read_header(path, strings=False)
    assert full.metadata["tokenizer.ggml.tokens"] == ["a", "bé", ""]
    skipped = fast.metadata["tokenizer.ggml.tokens"]
    assert skipped == SkippedArray(3) and len(skipped) == 3
    assert fast.tensors == full.tensors and fast.data_offset == full.data_offset
    raw = path.read_bytes()
    cut = raw.index(b"tokenizer.ggml.tokens") + 40
    (tmp_path / "cut.gguf").write_bytes(raw[:cut])
    for strings in (True, False):
        with pytest.raises(GGUFFormatError, match="truncated"):
            read_header(tmp_path / "cut.gguf", strings=strings)


def test_auto_layout_is_the_servers_native_when_the_kernels_are_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by file name, as the server's loader decides, without importing the server or MLX."""
    from gmlx_plan import cli
    from gmlx_server.engine import kernels

    assert cli.native_kernels_built() == kernels.built()
    monkeypatch.setattr(cli.platform, "system", lambda: "Linux")
    monkeypatch.setattr(cli, "native_kernels_built", lambda: True)
    assert cli._layout(None, None) == "native" and cli._layout("dense", None) == "dense"
    monkeypatch.setattr(cli, "native_kernels_built", lambda: False)
    assert cli._layout(None, None) == "dense" and cli._layout(None, "native") == "native"
    monkeypatch.undo()
    monkeypatch.setenv("GMLX_NATIVE_KERNELS", "0")
    assert cli.native_kernels_built() is False
