"""Which weight layout a model runs in, decidable without importing MLX (the capacity table needs it at boot)."""

from __future__ import annotations

import platform
from typing import Literal

from gmlx_server.engine import kernels
from gmlx_server.engine.blas import current_blas

LayoutChoice = Literal["auto", "packed", "dense", "native"]


def choose_layout(requested: str, on_gpu: bool | None = None, native: bool = True) -> tuple[str, str]:
    """Packed affine weights on Metal; on the CPU GGUF blocks read by our kernels when they are built
    (and `native`), else dense fp32 when an optimized BLAS runs the matmuls."""
    if requested != "auto":
        return requested, "configured"
    # mlx[cpu] on Linux has no GPU; on macOS MLX runs on Metal.
    gpu = on_gpu if on_gpu is not None else platform.system() == "Darwin"
    if gpu:
        return "packed", "GPU: quantized kernels are fastest"
    if native and kernels.built():
        return "native", "CPU: GGUF blocks as stored, read by gmlx's quantized kernels"
    blas = current_blas()
    if blas.name == "openblas":
        return "dense", "CPU with OpenBLAS: dense fp32 sgemm beats MLX's CPU quantized matmul"
    return "packed", f"CPU without OpenBLAS ({blas.note}): packed weights use less memory"
