"""`gmlx run` as a user runs it: a real process, the real models, the server's addressing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import gemma_path, smollm2_path
from tests.e2e.server import ROOT, production_env

pytestmark = pytest.mark.slow


def _run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gmlx_server.cli", "run", *args], cwd=ROOT, input=stdin,
                          env=production_env(), capture_output=True, text=True, timeout=300)


def test_default_model_answers_and_reports_speed() -> None:
    r = _run("What is the capital of France?", "--temperature", "0", "--max-tokens", "16")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    assert "tok/s" in r.stderr and "[stop]" in r.stderr


def test_raw_completion_from_stdin_on_gemma() -> None:
    prompt = "The Eiffel Tower is in the city of"
    r = _run(gemma_path(), "--raw", "--temperature", "0", "--max-tokens", "4", stdin=prompt)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(" Paris")


def test_profile_suffix_on_a_path_and_seed_reproduce(tmp_path: Path) -> None:
    args = (f"{smollm2_path()}@creative", "Name an animal.", "--seed", "7", "--max-tokens", "8")
    first, second = _run(*args), _run(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout


def test_unknown_profile_and_missing_model_fail_in_one_line(tmp_path: Path) -> None:
    bad = _run("--profile", "nope", "hi")
    assert bad.returncode == 2 and "unknown profile" in bad.stderr.lower() and "Traceback" not in bad.stderr
    hot = _run("--temperature", "5", "hi")  # a request's range, refused before any load
    assert hot.returncode == 2 and "'temperature': must be >= 0.0 and <= 2.0, got 5.0" in hot.stderr
    cfg = tmp_path / "gmlx.yaml"
    cfg.write_text(f"models:\n  a:\n    path: {smollm2_path()}\n  b:\n    path: {smollm2_path()}\n")
    missing = _run("--config", str(cfg), "zzz", "hi")
    assert missing.returncode == 2 and "not found" in missing.stderr and "Traceback" not in missing.stderr
