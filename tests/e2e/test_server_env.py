"""The environment of the gmlx processes the tests start (tests/e2e/server.py's production_env): no torch, as
in a production install, while a test's own sitecustomize on PYTHONPATH (a fault hook, a network guard) runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.e2e.server import ROOT, production_env

_PROBE = """
import json, os, sys
import gmlx_server.engine.factory, gmlx_server.app  # what gmlx serve imports, mlx-vlm and transformers too
torch = sorted(m for m, mod in sys.modules.items() if (m == "torch" or m.startswith("torch.")) and mod is not None)
print(json.dumps({"torch": torch, "hook": os.environ.get("HOOK_RAN")}))
"""


def test_a_served_gmlx_runs_without_torch_and_the_tests_own_hook_still_runs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['HOOK_RAN'] = 'yes'\n")
    env = production_env({"PYTHONPATH": str(tmp_path)})
    done = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"torch": [], "hook": "yes"}
