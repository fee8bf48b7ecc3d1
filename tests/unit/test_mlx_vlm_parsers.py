"""mlx-vlm's parser files load alone; one that cannot falls back to the package import and says so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_a_parser_that_cannot_load_alone_is_imported_through_the_package_and_logged(tmp_path: Path) -> None:
    parsers = tmp_path / "mlx_vlm" / "tools" / "parsers"
    parsers.mkdir(parents=True)
    for pkg in (tmp_path / "mlx_vlm", tmp_path / "mlx_vlm" / "tools", parsers):
        (pkg / "__init__.py").write_text("")
    (parsers / "alone.py").write_text("NAME = 'alone'\n")
    (parsers / "helper.py").write_text("NAME = 'relative'\n")
    (parsers / "relative.py").write_text("from .helper import NAME\n")  # fails when loaded as a lone file
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO, format='%(name)s %(message)s'); "
            "from gmlx_server.protocol.tools.mlx_vlm_parsers import mlx_vlm_parser as p; "
            "assert p('alone').NAME == 'alone' and 'mlx_vlm' not in sys.modules; "
            "assert p('relative').NAME == 'relative' and 'mlx_vlm.tools.parsers' in sys.modules; "
            "p('relative')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    logged = [line for line in done.stderr.splitlines() if line.startswith("gmlx.tools ")]
    assert len(logged) == 1 and "mlx_vlm.tools.parsers.relative" in logged[0], done.stderr
