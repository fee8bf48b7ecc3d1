"""An install on a machine without a C++ compiler: the build step skips the CPU kernels and the install
succeeds; the server then runs on MLX's own CPU ops, says so once in its log, and answers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.e2e.server import ROOT, gmlx_serve

pytestmark = pytest.mark.slow
PACKAGES = ("gmlx_server", "gmlx_plan", "gmlx_top")


def _bare_path(tmp: Path) -> str:
    """A PATH with the interpreter and nothing else: no c++, g++, clang++ or cmake."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    return str(bin_dir)


def test_the_build_step_skips_the_kernels_without_a_compiler(tmp_path: Path) -> None:
    """setup.py's build_ext, run where PATH has no compiler or CMake: it says why and succeeds."""
    src = tmp_path / "src"
    (src / "gmlx_server/engine/kernels").mkdir(parents=True)
    for name in ("setup.py", "pyproject.toml", "gmlx_server/engine/kernels/build.py"):
        shutil.copy(ROOT / name, src / name)
    out = subprocess.run([sys.executable, "setup.py", "build_ext", "--build-lib", str(tmp_path / "lib"),
                          "--build-temp", str(tmp_path / "tmp")], cwd=src, capture_output=True, text=True,
                         env={**os.environ, "PATH": _bare_path(tmp_path)}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "gmlx: CPU kernels not built (cmake not found on PATH)" in out.stdout
    assert not list(tmp_path.rglob("_gguf_kernels*.so"))


def test_the_server_serves_without_the_kernels_and_says_why(tmp_path: Path) -> None:
    for pkg in PACKAGES:  # the product as an install without the extension would lay it out
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("_gguf_kernels*", "__pycache__"))
    env = {"PATH": _bare_path(tmp_path) + os.pathsep + os.environ.get("PATH", "")}
    with gmlx_serve([], tmp_path, env=env, cwd=tmp_path) as server:
        r = httpx.post(server.v1 + "/chat/completions", timeout=300, json={
            "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
        log = server.log()
    # "not built" can only come from the copy: the checkout beside it has the extension
    assert "gmlx CPU kernels unavailable, falling back: not built" in log
