"""Compile the kernels extension with CMake against the MLX and nanobind of a Python interpreter.

    python -m gmlx_server.engine.kernels.build      # rebuild in place (after an MLX upgrade, say)

setup.py loads this file by path at install time (stdlib only: nothing of gmlx is importable then).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


class BuildError(RuntimeError):
    """The extension could not be built here; the message says what is missing."""


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def _check_tools(python: str) -> str:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise BuildError("cmake not found on PATH")
    if _compiler() is None:
        raise BuildError("no C++ compiler (c++, g++ or clang++) on PATH")
    for mod in ("nanobind", "mlx"):
        probe = subprocess.run([python, "-c", f"import {mod}"], capture_output=True, text=True)
        if probe.returncode != 0:
            raise BuildError(f"{python} cannot import {mod} (pip install {mod})")
    return cmake


def build(out_dir: Path = HERE, python: str = sys.executable, jobs: int | None = None, quiet: bool = True) -> Path:
    """Build `_gguf_kernels` into out_dir; returns its path or raises BuildError."""
    cmake = _check_tools(python)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gmlx-kernels-") as tmp:
        steps = [
            [cmake, "-S", str(HERE), "-B", tmp, f"-DPython_EXECUTABLE={python}", f"-DGK_OUTPUT_DIR={out_dir}",
             "-DCMAKE_BUILD_TYPE=Release"],
            [cmake, "--build", tmp, "-j", str(jobs or os.cpu_count() or 1)],
        ]
        for cmd in steps:
            done = subprocess.run(cmd, capture_output=quiet, text=True)
            if done.returncode != 0:
                tail = "\n".join(((done.stdout or "") + (done.stderr or "")).splitlines()[-20:])
                raise BuildError(f"{' '.join(cmd[:2])} failed:\n{tail}")
    found = sorted(out_dir.glob("_gguf_kernels*"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise BuildError(f"the build finished but left no _gguf_kernels in {out_dir}")
    return found[-1]


def main() -> int:
    try:
        path = build(quiet=False)
    except BuildError as e:
        print(f"gmlx kernels: not built: {e}", file=sys.stderr)
        return 1
    print(f"gmlx kernels: built {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
