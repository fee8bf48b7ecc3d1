"""Importing gmlx has no side effects: only the entry points that run MLX preload BLAS, honoring GMLX_BLAS."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gmlx_server.engine.blas import _CANDIDATES

# Prints what the process holds after running the given statements: mlx modules and BLAS libraries mapped.
_PROBE = """
import json, sys
{body}
maps = open("/proc/self/maps").read()
print(json.dumps({{"mlx": sorted(m for m in sys.modules if m == "mlx" or m.startswith("mlx.")),
                   "openblas": "openblas" in maps, "blas": {blas}}}))
"""


def _probe(body: str, blas: str = "None", **env: str) -> dict[str, object]:
    code = _PROBE.format(body=body, blas=blas)
    run_env = {k: v for k, v in os.environ.items() if k != "GMLX_BLAS"} | env
    done = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _openblas_installed() -> bool:
    return any(Path(c).exists() for c in _CANDIDATES)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc (Linux)")
def test_top_plan_launch_and_config_load_neither_mlx_nor_openblas() -> None:
    got = _probe("import gmlx_top.app, gmlx_plan.cli, gmlx_server.launch, gmlx_server.config, gmlx_server.cli")
    assert got == {"mlx": [], "openblas": False, "blas": None}
    # The probe sees a preload when there is one: the same process after the entry points' call.
    if _openblas_installed():
        after = _probe("from gmlx_server.startup import preload_blas; preload_blas()")
        assert after["openblas"] is True and after["mlx"] == []


@pytest.mark.skipif(not _openblas_installed(), reason="OpenBLAS is not installed")
def test_gmlx_blas_off_keeps_the_reference_blas_for_mlx() -> None:
    body = ("from gmlx_server.startup import preload_blas; choice = preload_blas(); "
            "import mlx.core as mx; mx.eval(mx.ones((64, 64)) @ mx.ones((64, 64)))")
    on = _probe(body, blas="choice.name")
    off = _probe(body, blas="choice.name", GMLX_BLAS="off")
    assert (on["blas"], on["openblas"]) == ("openblas", True)
    assert (off["blas"], off["openblas"]) == ("disabled", False) and off["mlx"] != []


def test_a_library_named_by_gmlx_blas_is_the_one_loaded(tmp_path: Path) -> None:
    lib = next((c for c in _CANDIDATES if Path(c).exists()), None)
    if lib is None:
        pytest.skip("OpenBLAS is not installed")
    named = tmp_path / "libnamedblas.so.3"  # a copy no default candidate names
    shutil.copy(lib, named)
    got = _probe("from gmlx_server.startup import preload_blas; choice = preload_blas(); "
                 f"assert {str(named)!r} in open('/proc/self/maps').read()", blas="choice.path", GMLX_BLAS=str(named))
    assert got["blas"] == str(named)


@pytest.mark.skipif(not _openblas_installed(), reason="OpenBLAS is not installed")
def test_the_asgi_entry_point_preloads_blas_before_any_engine_loads(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")  # engines load on first request: the file is not read here
    body = "import gmlx_server.asgi; from gmlx_server.engine.blas import current_blas"
    got = _probe(body, blas="current_blas().name", GMLX_MODEL=str(tmp_path / "m.gguf"))
    assert got == {"mlx": [], "openblas": True, "blas": "openblas"}
    off = _probe(body, blas="current_blas().name", GMLX_MODEL=str(tmp_path / "m.gguf"), GMLX_BLAS="off")
    assert off["blas"] == "disabled"
