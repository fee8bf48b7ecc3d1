"""gmlx plan and a real server agree: the --json capacity equals /v1/metrics' section field for field,
and /v1/capacity/plan's ok equals the planner's over a grid of widths and depths (both real models)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import gemma_path, smollm2_path
from tests.e2e.server import gmlx_serve

pytestmark = pytest.mark.slow
BUDGET = 3 * 1024**3  # a configured budget: the planner and the server must not measure different machines


@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_plan_json_equals_the_server_capacity_and_verdicts(tmp_path: Path, which: str) -> None:
    path = smollm2_path() if which == "smollm2" else gemma_path()
    cfg = tmp_path / "gmlx.yaml"
    cfg.write_text(f"server:\n  memory_budget: {BUDGET}\n  decode_batch: 4\nmodels:\n  {which}:\n    path: {path}\n")
    grid = [(w, d) for w in (1, 3, 4, 16) for d in (512, 8192, 30000)]
    planned = {}
    for w, d in grid:
        out = subprocess.run([sys.executable, "-m", "gmlx_server.cli", "plan", "--config", str(cfg), "--model", which,
                              "--width", str(w), "--depth", str(d), "--json"], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode in (0, 1), out.stderr
        planned[(w, d)] = json.loads(out.stdout)
    with gmlx_serve(["--config", str(cfg)], tmp_path) as s:
        server_cap = httpx.get(s.v1 + "/metrics", timeout=10).json()["server"]["capacity"]
        assert planned[grid[0]]["capacity"] == server_cap  # field for field
        for (w, d), p in planned.items():
            live = httpx.get(s.v1 + "/capacity/plan", params={"width": w, "depth": d}, timeout=10).json()
            assert live["ok"] == p["plan"]["ok"], (w, d, live, p["plan"])
