"""Which weight layout and KV dtype a model runs in, decidable without importing MLX (the capacity table needs
them at boot)."""

from __future__ import annotations

import platform

from gmlx_plan.budget import available_memory
from gmlx_plan.gguf_header import GGUFHeader
from gmlx_plan.memory import KVDtype, KVDtypeChoice, Layout, LayoutChoice, kv_bytes, model_from_header, resolve_kv_dtype
from gmlx_server.engine import kernels
from gmlx_server.engine.blas import current_blas


def choose_layout(requested: LayoutChoice, on_gpu: bool | None = None, native: bool = True,
                  header: GGUFHeader | None = None) -> tuple[Layout, str]:
    """Packed affine weights on Metal; on the CPU GGUF blocks read by our kernels when they are built
    (and `native`), else dense fp32 when an optimized BLAS runs the matmuls and the model (its `header`)
    fits dense beside a full window's KV in the memory available now."""
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
        too_big = _dense_too_big(header)
        if too_big:
            return "packed", f"CPU with OpenBLAS, but {too_big}: packed weights use a quarter of that"
        return "dense", "CPU with OpenBLAS: dense fp32 sgemm beats MLX's CPU quantized matmul"
    return "packed", f"CPU without OpenBLAS ({blas.note}): packed weights use less memory"


def kv_dtype(choice: KVDtypeChoice, native: bool = True, on_gpu: bool | None = None) -> KVDtype:
    """What the unquantized KV caches will hold: auto is float16 where gmlx's CPU kernels run the attention (built,
    `native`, not on Metal), as the loader decides from the kernels it got."""
    gpu = on_gpu if on_gpu is not None else platform.system() == "Darwin"
    return resolve_kv_dtype(choice, kernels_attend=not gpu and native and kernels.built())


def _dense_too_big(header: GGUFHeader | None) -> str | None:
    """Why dense fp32 cannot be the layout (a 1.5B model's is ~7 GB), or None when it fits or nothing says."""
    room = available_memory() if header is not None else None
    if header is None or room is None:
        return None
    m = model_from_header(header, "dense")
    need = m.weights_bytes + kv_bytes(m, m.geometry.context_length)
    if need <= room:
        return None
    return f"dense fp32 weights and a full window's KV need {need / 1e9:.1f} GB of the {room / 1e9:.1f} GB available"
