"""GGUF-native quantized matmul kernels for MLX's CPU device (a C++ MLX primitive, built at install time).

The compiled extension `_gguf_kernels` sits beside this file when the install had a C++ compiler and
CMake (or after `python -m gmlx_server.engine.kernels.build`). `probe()` says whether it can run here:
present, compiled against the running MLX, and accepted by MLX's bindings; otherwise the reason, which
the loader logs once before falling back to the dense/packed layouts.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from gmlx_plan.gguf_header import GGML_TYPES
from gmlx_plan.memory import NATIVE_TYPES as PLANNED_NATIVE

# ggml type numbers that a kernel reads as stored: the planner's list, numbered by the header reader's table
# (src/formats.h's QType enum is checked against it in tests/unit/test_one_source.py)
NATIVE_TYPES: dict[str, int] = {name: type_id for type_id, (name, _, _) in sorted(GGML_TYPES.items())
                                if name in PLANNED_NATIVE}
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class KernelStatus:
    ext: ModuleType | None
    reason: str  # why not, or what runs ("avx-vnni, 2 threads")

    @property
    def available(self) -> bool:
        return self.ext is not None


def built() -> bool:
    """The extension file exists (decidable without importing MLX)."""
    return any(HERE.glob("_gguf_kernels*.so")) or any(HERE.glob("_gguf_kernels*.pyd"))


# what the Python side calls; an extension built before one of them was added is refused, not half-used
# (sdpa_float16: its attention reads float16 KV caches, which the loader builds when the kernels attend)
_FUNCTIONS = ("matmul", "dequantize", "rms_norm", "rope", "sdpa", "gated", "split_key", "categorical_at",
              "sdpa_float16", "repack_q4k", "repack_q5k", "repack_q6k")


@functools.cache  # the extension loads once per process
def probe() -> KernelStatus:
    if not built():
        return KernelStatus(None, "not built (no C++ compiler or CMake at install; "
                                  "`python -m gmlx_server.engine.kernels.build` builds it)")
    import mlx.core as mx

    from gmlx_server.engine.mlx_adapter import mlx_version

    try:
        ext = importlib.import_module("gmlx_server.engine.kernels._gguf_kernels")
    except ImportError as e:
        return KernelStatus(None, f"cannot load the extension: {e}")
    running = mlx_version()
    if ext.mlx_version != running:
        return KernelStatus(None, f"built against MLX {ext.mlx_version}, running {running}: rebuild with "
                                  "`python -m gmlx_server.engine.kernels.build`")
    missing = [f for f in _FUNCTIONS if not hasattr(ext, f)]
    if missing:
        return KernelStatus(None, f"built from older sources (no {', '.join(missing)}): rebuild with "
                                  "`python -m gmlx_server.engine.kernels.build`")
    try:  # a nanobind ABI other than MLX's cannot take an mx.array
        ext.dequantize(mx.zeros((1, 18), dtype=mx.uint8), NATIVE_TYPES["Q4_0"], 32, stream=mx.cpu)
    except TypeError as e:
        return KernelStatus(None, f"the extension's bindings do not match MLX's ({e}); rebuild it")
    return KernelStatus(ext, f"{ext.isa()}, {ext.threads()} threads")
