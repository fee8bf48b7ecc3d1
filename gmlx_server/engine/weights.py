"""Put converted GGUF tensors into an mlx-vlm model: names, quantized modules, tied heads, RoPE factors."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from gmlx_server.engine.arch import ArchSpec
from gmlx_server.engine.gguf_tensors import ConvertedTensor
from gmlx_server.engine.kernels import probe
from gmlx_server.engine.kernels.fast_ops import RMSNorm, RoPE, RopeArgs
from gmlx_server.engine.kernels.modules import GGUFEmbedding, GGUFLinear
from gmlx_server.engine.mlx_adapter import module_at, replace_module
from gmlx_server.engine.vlm_adapter import has_head, norm_offset, rope_dims


def install_weights(model: Any, spec: ArchSpec, tensors: dict[str, ConvertedTensor]) -> None:
    weights: dict[str, mx.array] = {}
    quant: dict[str, tuple[int, int]] = {}
    natives: dict[str, int] = {}  # module path -> ggml type of its blocks ("native" layout)
    rope_freqs = None
    for gguf_name, t in tensors.items():
        if gguf_name == "rope_freqs.weight":
            rope_freqs = t.arrays["weight"]
            continue
        name = spec.hf_name(gguf_name)
        if name is None:
            raise ValueError(f"tensor {gguf_name} ({t.source_type}) has no place in the {spec.module} model")
        base = name.rsplit(".", 1)[0]
        for part, arr in t.arrays.items():
            if part == "weight" and spec.norm_offset and base.endswith("norm"):
                arr = arr + spec.norm_offset
            weights[f"{base}.{part}" if len(t.arrays) > 1 or part != "weight" else name] = arr
        if t.bits is not None and t.group_size is not None:
            quant[base] = (t.group_size, t.bits)
        if t.native_type is not None:
            natives[base] = t.native_type
    if "lm_head.weight" not in weights and has_head(model):
        _tie_head(weights, quant, natives)  # the class has a head slot but the file shares the embedding
    if natives:
        _use_native_modules(model, natives)
    if quant:
        nn.quantize(model, class_predicate=lambda p, m: _qparams(quant, p))
    model.load_weights(list(weights.items()), strict=True)
    if rope_freqs is not None:
        _apply_rope_freqs(model, rope_freqs)
    if spec.norm_offset:
        _fold_norm_offsets(model)
    mx.eval(model.parameters())


def _fold_norm_offsets(model: nn.Module) -> None:
    """Gemma's RMSNorm with its `1 + w` computed once at load; mlx-vlm's adds it on every call (2 ops each,
    ~220 a decode step of Gemma 3). The folded weight is the very value the call computed."""
    norms = [(p, m, offset) for p, m in model.named_modules() if (offset := norm_offset(m)) is not None]
    for path, m, offset in norms:
        replace_module(model, path, RMSNorm(offset + m.weight, m.eps))


def _qparams(quant: dict[str, tuple[int, int]], path: str) -> dict[str, int] | bool:
    if path not in quant:
        return False
    group, bits = quant[path]
    return {"group_size": group, "bits": bits}


def _tie_head(weights: dict[str, mx.array], quant: dict[str, tuple[int, int]], natives: dict[str, int]) -> None:
    for part in ("weight", "scales", "biases"):
        if f"model.embed_tokens.{part}" in weights:
            weights[f"lm_head.{part}"] = weights[f"model.embed_tokens.{part}"]  # shared, not copied
    if "model.embed_tokens" in quant:
        quant["lm_head"] = quant["model.embed_tokens"]
    if "model.embed_tokens" in natives:
        natives["lm_head"] = natives["model.embed_tokens"]


def _use_native_modules(model: nn.Module, natives: dict[str, int]) -> None:
    """Linear/Embedding modules whose weights are GGUF blocks become kernel-backed ones (same paths)."""
    ext = probe().ext
    if ext is None:
        raise RuntimeError(f"native weights need the kernels extension: {probe().reason}")
    modules = dict(model.named_modules())
    for path, qtype in natives.items():
        m = modules[path]
        out_dims, in_dims = m.weight.shape
        new = (GGUFEmbedding(ext, qtype, out_dims, in_dims) if isinstance(m, nn.Embedding)
               else GGUFLinear(ext, qtype, in_dims, out_dims, bias="bias" in m))
        replace_module(model, path, new)


def _apply_rope_freqs(model: Any, factors: mx.array) -> None:
    args = model.args
    for layer in model.model.layers:
        attn = layer.self_attn
        dims = rope_dims(attn.rope, factors.shape[0] * 2)
        attn.rope = _freq_rope(dims, args.rope_theta, factors, args.rope_traditional)


def _freq_rope(dims: int, base: float, factors: mx.array, traditional: bool) -> RoPE:
    """Llama-3 GGUFs carry per-frequency factors (rope_freqs.weight) instead of a scaling config."""
    inv = base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)
    return RoPE(RopeArgs(dims, traditional, None, 1.0, inv * factors.astype(mx.float32)))


class TransposedLinear(nn.Module):
    """A dense Linear that stores W^T: OpenBLAS's sgemm at one row is ~1.5x faster without the transpose."""

    def __init__(self, weight_t: mx.array, bias: mx.array | None) -> None:
        super().__init__()
        self.weight_t = weight_t
        if bias is not None:
            self.bias = bias

    def __call__(self, x: mx.array) -> mx.array:
        y = x @ self.weight_t
        return y + self.bias if "bias" in self else y


class TransposedEmbedding(nn.Module):
    """An embedding kept as W^T so a tied output head reads it without a transpose and without a copy."""

    def __init__(self, weight_t: mx.array) -> None:
        super().__init__()
        self.weight_t = weight_t

    def __call__(self, ids: mx.array) -> mx.array:
        return mx.moveaxis(mx.take(self.weight_t, ids, axis=1), 0, -1)

    def as_linear(self, x: mx.array) -> mx.array:
        return x @ self.weight_t


def transpose_dense_linears(model: nn.Module) -> int:
    """Swap dense Linear/Embedding modules for transposed ones (CPU dense layout only); returns how many.

    Tensor by tensor, each original released as its module is replaced: the load peaks at one extra matrix,
    not a second copy of the model. A tied head and its embedding share one transposed array.
    """
    paths = [path for path, m in model.named_modules() if type(m) in (nn.Linear, nn.Embedding)]
    uses: dict[int, int] = {}
    for path in paths:
        w = module_at(model, path).weight
        uses[id(w)] = uses.get(id(w), 0) + 1
    del w
    shared: dict[int, tuple[mx.array, mx.array]] = {}  # a tied original (kept alive, so its id stays its) -> T
    for path in paths:
        m = module_at(model, path)
        w = m.weight
        if uses[id(w)] > 1 and id(w) not in shared:
            shared[id(w)] = (w, mx.contiguous(w.T))
        wt = shared[id(w)][1] if id(w) in shared else mx.contiguous(w.T)
        new = TransposedEmbedding(wt) if isinstance(m, nn.Embedding) else TransposedLinear(wt, m.get("bias"))
        mx.eval(new.parameters())
        replace_module(model, path, new)
        del m, w, wt, new
    return len(paths)
