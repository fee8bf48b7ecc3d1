"""`gmlx plan check` budgets the prompt cache's disk tier: per-session bytes at --depth and sessions the cap holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gmlx_plan.cli import main
from tests.conftest import smollm2_path

BASE = ("--width", "2", "--depth", "1000", "--memory", "2GiB", "--layout", "packed")


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["plan", *argv, "--json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


@pytest.mark.parametrize("kv_quant", ["none", "uniform:8", "kvarn:4:8:128"])
def test_per_token_bytes_are_the_capacity_tables(kv_quant: str, capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, "--model", smollm2_path(), *BASE, "--kv-quant", kv_quant, "--disk-cache", "1GiB")
    cap, disk = data["capacity"], data["disk_tier"]
    assert isinstance(cap, dict) and isinstance(disk, dict)
    assert disk["kv_bytes_per_token"] == cap["kv_bytes_per_token"] > 0
    assert disk["bytes_per_session"] == disk["kv_bytes_per_token"] * 1000
    assert disk["sessions"] == (1 << 30) // disk["bytes_per_session"] and disk["cap_bytes"] == 1 << 30


def test_quantized_kv_holds_more_sessions(capsys: pytest.CaptureFixture[str]) -> None:
    plain = _json(capsys, "--model", smollm2_path(), *BASE, "--disk-cache", "1GiB")["disk_tier"]
    packed = _json(capsys, "--model", smollm2_path(), *BASE, "--kv-quant", "uniform:4", "--disk-cache", "1GiB")
    assert isinstance(plain, dict) and isinstance(packed["disk_tier"], dict)
    assert packed["disk_tier"]["sessions"] > plain["sessions"]


def test_text_report_has_the_section_only_when_on(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", smollm2_path(), *BASE, "--disk-cache", "8GiB"]) == 0
    out = capsys.readouterr().out
    assert "disk tier 8.00 GiB:" in out and "sessions at 1000 tokens" in out
    assert main(["plan", "--model", smollm2_path(), *BASE, "--disk-cache", "0"]) == 0
    assert "disk tier" not in capsys.readouterr().out
    assert "disk_tier" not in _json(capsys, "--model", smollm2_path(), *BASE)


def test_config_key_is_the_default_and_the_flag_wins(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "gmlx.yaml"
    cfg.write_text(f"server:\n  prompt_cache_disk_bytes: 2GiB\nmodels:\n  smol:\n    path: {smollm2_path()}\n")
    disk = _json(capsys, "--model", "smol", "--config", str(cfg), *BASE)["disk_tier"]
    assert isinstance(disk, dict) and disk["cap_bytes"] == 2 << 30
    assert "disk_tier" not in _json(capsys, "--model", "smol", "--config", str(cfg), *BASE, "--disk-cache", "0")


@pytest.mark.parametrize("bad", ["lots", "-1G"])
def test_bad_caps_are_refused_by_name(bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", smollm2_path(), *BASE, f"--disk-cache={bad}"]) == 2
    assert "--disk-cache" in capsys.readouterr().err
    cfg = tmp_path / "gmlx.yaml"
    cfg.write_text(f"server:\n  prompt_cache_disk_bytes: {bad}\nmodels:\n  smol:\n    path: {smollm2_path()}\n")
    assert main(["plan", "--model", "smol", "--config", str(cfg), *BASE]) == 2
    assert "server.prompt_cache_disk_bytes" in capsys.readouterr().err
