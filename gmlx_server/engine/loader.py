"""Load a GGUF file into an mlx-vlm text model class, with its tokenizer and chat template."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import mlx.core as mx

from gmlx_plan.geometry import DEFAULT_CONTEXT, geometry_from_header
from gmlx_plan.gguf_header import GGUFHeader, SkippedArray, read_header
from gmlx_plan.memory import KVDtypeChoice, KVQuant, Layout, LayoutChoice, quantized_layers, resolve_kv_dtype
from gmlx_server.engine.arch import ArchSpec, arch_spec, make_cache, vocab_size
from gmlx_server.engine.attention import use_gmlx_attention
from gmlx_server.engine.blas import current_blas
from gmlx_server.engine.chat_template import JinjaChatTemplate
from gmlx_server.engine.gguf_tensors import LoadReport, load_gguf_tensors
from gmlx_server.engine.kernels import probe
from gmlx_server.engine.kernels.blocks import use_fused_blocks
from gmlx_server.engine.kernels.fast_ops import Primitives, use_kernel_modules
from gmlx_server.engine.kernels.heads import use_heads_attention
from gmlx_server.engine.kernels.modules import fuse_projections
from gmlx_server.engine.kv_quant import CacheFactory
from gmlx_server.engine.layout import choose_layout
from gmlx_server.engine.tokenizer import GGUFTokenizer
from gmlx_server.engine.types import ModelInfo
from gmlx_server.engine.vision.prefill import VisionRuntime
from gmlx_server.engine.weights import install_weights, transpose_dense_linears

log = logging.getLogger("gmlx.engine")


@dataclass
class LoadedModel:
    model: Any  # an mlx_vlm.models.<arch>.language.LanguageModel
    header: GGUFHeader
    spec: ArchSpec
    info: ModelInfo
    tokenizer: GGUFTokenizer
    template: JinjaChatTemplate
    report: LoadReport
    make_cache: CacheFactory  # a request's fresh per-layer caches (quantized where kv_quant says)
    vision: VisionRuntime | None = None  # the vision tower a prompt's images prefill through (None: text only)
    kernels: Primitives | None = None  # what this model's norms, RoPEs, MLPs and attention call (None: MLX's own)


def load_gguf_model(path: str | Path, model_id: str | None = None, layout: LayoutChoice = "auto",
                    max_kv_size: int | None = None, chat_template: str | None = None,
                    native_kernels: bool = True, kv_quant: KVQuant | None = None,
                    kv_dtype: KVDtypeChoice = "auto") -> LoadedModel:
    """`native_kernels=False` keeps "auto" off the native layout (the dense/packed paths stay testable);
    kv_quant: quantized KV caches on the layers gmlx_plan.memory.quantized_layers picks; kv_dtype: the other
    layers' (auto: float16 when the kernels run this model's attention)."""
    start = time.perf_counter()
    header = read_header(path)
    spec = arch_spec(header)
    # Before the weights, so the weights reuse what the vocabulary's transients (the header's arrays, the
    # derived merges) freed: built after them, that memory sat above the weights, where the engine thread's
    # malloc arena keeps it past malloc_trim (Gemma 3: ~15 MB).
    tokenizer = GGUFTokenizer.from_metadata(header.metadata)
    template = JinjaChatTemplate.from_metadata(header.metadata, spec.family, chat_template)
    header = without_vocabulary_arrays(header)
    params = spec.build_config(header, vocab_size(header))
    model = spec.model_class()(spec.make_config(params))
    on_gpu = mx.default_device() == mx.gpu
    chosen, why = _layout(layout, on_gpu, native_kernels, header)
    tensors, report = load_gguf_tensors(path, header.tensors, chosen)
    install_weights(model, spec, tensors)
    del tensors  # the model holds the arrays now; dropping the dict lets transposed copies replace them
    if chosen == "dense":
        transpose_dense_linears(model)
    elif chosen == "native":
        fuse_projections(model)  # q/k/v and gate/up as one matmul each
    kernels = _kernel_primitives(model, not on_gpu and native_kernels)
    # Metal keeps mx.fast's fused kernel; on the CPU ours is ~1.3-1.7x faster (bench/attention.py)
    use_gmlx_attention(model, cpu=not on_gpu, prims=kernels or Primitives(None))
    if kernels is not None and chosen == "native":
        use_heads_attention(model, kernels)  # each layer's q/k/v heads in one primitive
    if kernels is not None:  # last: the layers' norms, attention and MLP are what they will run
        use_fused_blocks(model, kernels)  # each residual add with the norm after it
    mx.clear_cache()  # the buffers of replaced arrays (fused parts, transposed originals) stay cached otherwise
    trained = int(header.arch_value("context_length", DEFAULT_CONTEXT))
    held = resolve_kv_dtype(kv_dtype, kernels_attend=kernels is not None)
    caches = CacheFactory(lambda: make_cache(model), kv_quant,
                          quantized_layers(geometry_from_header(header), kv_quant), held == "float16")
    info = ModelInfo(
        model_id=model_id or Path(path).stem, path=str(path), architecture=header.architecture,
        family=spec.family, context_length=min(trained, max_kv_size) if max_kv_size else trained,
        trained_context_length=trained, n_layers=params["num_hidden_layers"],
        n_kv_heads=params["num_key_value_heads"], head_dim=params.get("head_dim") or
        params["hidden_size"] // params["num_attention_heads"],
        sliding_window=params.get("sliding_window"), weights_layout=chosen,
        weights_bytes=report.total_bytes, load_s=time.perf_counter() - start,
        tensor_types={src: became for (src, became) in report.by_type}, kv_quant=caches.report(),
        kv_dtype=held,
    )
    _log_load(info, report, why, template.source, "mx.fast" if on_gpu else "gmlx CPU (folded GQA, exp2 softmax)")
    return LoadedModel(model, header, spec, info, tokenizer, template, report, caches, kernels=kernels)


# Read only while the tokenizer and chat template are built: Gemma 3's 262K tokens, scores and types are
# ~39 MB of Python objects. The tokenizer answers for the pieces; a drafter's list is compared with the file's.
VOCABULARY_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                     "tokenizer.ggml.merges")


def without_vocabulary_arrays(header: GGUFHeader) -> GGUFHeader:
    """The header with the tokenizer-only arrays replaced by their lengths (as read_header(strings=False))."""
    meta = {k: SkippedArray(len(v)) if k in VOCABULARY_ARRAYS and isinstance(v, list) else v
            for k, v in header.metadata.items()}
    return replace(header, metadata=meta)


def _layout(requested: LayoutChoice, on_gpu: bool, native_kernels: bool,
            header: GGUFHeader) -> tuple[Layout, str]:
    chosen, why = choose_layout(requested, on_gpu=on_gpu, native=native_kernels, header=header)
    if chosen != "native":
        if requested == "auto" and not on_gpu and native_kernels:  # e.g. installed without a compiler
            log.warning("gmlx CPU kernels unavailable, falling back: %s", probe().reason)
        return chosen, why
    status = probe()
    if status.available:
        return chosen, f"{why} ({status.reason})"
    if requested == "native":
        raise RuntimeError(f"weights: native needs gmlx's CPU kernels: {status.reason}")
    log.warning("gmlx CPU kernels unavailable, falling back: %s", status.reason)
    return choose_layout(requested, on_gpu=on_gpu, native=False, header=header)


def _kernel_primitives(model: Any, wanted: bool) -> Primitives | None:
    """This model's norms, RoPEs and gated MLPs as single CPU primitives (None: kernels off or unavailable, and
    the model keeps MLX's own ops); only this model: another in the process keeps its own path."""
    ext = probe().ext if wanted else None
    if ext is None:
        return None
    prims = Primitives(ext)
    use_kernel_modules(model, prims)
    return prims


def _log_load(info: ModelInfo, report: LoadReport, why: str, template_source: str, attention: str) -> None:
    log.info("loaded %s (%s, %s) in %.2f s: %d layers, context %d, weights %s (%s), %.1f MB; BLAS %s; attention %s",
             info.model_id, info.architecture, info.path, info.load_s, info.n_layers, info.context_length,
             info.weights_layout, why, info.weights_bytes / 1e6, current_blas().name, attention)
    for line in report.lines():
        log.info("  tensors: %s", line)
    log.info("  chat template: %s", template_source)
    log.info("  KV cache dtype: %s", info.kv_dtype)
    q = info.kv_quant
    if q is not None:
        log.info("  KV cache: %s %d-bit, group %d: %d layers quantized, %d not (%s)", q.scheme, q.bits, q.group_size,
                 q.layers_quantized, q.layers_fp16, q.verdict)
