"""Bytes a model costs in MLX memory: weights after conversion, KV cache per stream, prefill transient.

Weights (what gmlx_server/engine/gguf_tensors.py makes of each GGUF tensor; PACKED_BITS is the
one table of per-type bits, which the engine's converter imports):

  packed layout  2-D quantized tensor of n elements -> MLX affine, group 32, fp16 scales and biases:
                 n * bits / 8 + (n / 32) * 2 * 2 bytes; 2-D F32/F16/BF16/F64 -> fp16 (2 n);
                 1-D F32 stays f32 (4 n); any other 1-D tensor -> fp16 (2 n)
  dense layout   every tensor -> fp32 (4 n) (2-D ones are stored transposed: same bytes)

KV cache for one stream at depth D (mlx-vlm's KVCache / RotatingKVCache / QuantizedKVCache):

  tokens held by a layer   C(D) = min(ceil(D / 256) * 256, window)  (caches grow in steps of 256;
                           a sliding layer never holds more than its window)
  per token, plain layer   kv_heads * (key_dim + value_dim) * kv_e, kv_e = the KV cache dtype's bytes
                           (kv_dtype: 2 for float16, which the CPU kernels read as stored; else e, the
                           activation dtype's bytes: ACTIVATION_BYTES, 4 in every layout today, measured:
                           the 1-D F32 norm weights promote the packed layout's fp16 activations to fp32)
  per token, quantized     kv_heads * sum over K and V of dim * bits / 8 + dim / group * 2 * e
                           (mx.quantize keeps scales and biases in the input dtype, the activations')
  kvarn                    keys at `bits`, values at `value_bits`; the newest min(D, tail) tokens stay at
                           e bytes (the activation dtype, whatever kv_dtype says), and past the tail the
                           quantized store holds C(D) - tail tokens (its growth keeps the layer's total on
                           the 256-token steps a plain cache takes)
  which layers quantize    full-attention layers whose head dims the group divides; not sliding ones
                           (RotatingKVCache has no quantized form in mlx-vlm). The last layer quantizes
                           too (mlx-vlm's own generate keeps it fp16 on deep stacks; gmlx builds its caches)

Prefill transient for `rows` query rows (a chunk of the prompt, or one decode step of `rows`
streams) whose last token sits at depth D; one layer's working set is live at a time:

  activations  rows * e * (4 hidden + 2 q_dim + 2 kv_dim + 3 ffn)
               (residual, normed input, attention and o_proj outputs; q and k, v before and after
               RoPE; MLP gate, up and their product)
  scores       rows * n_heads * K * (2 e + 1), K = D for a full layer, min(D, window + rows - 1)
               for a sliding one: scores and softmax in the activation dtype plus a bool mask, as
               MLX's unfused attention materializes them (every CPU run; Metal for head dims other
               than 64/80/128). 0 with fused_attention (Metal's flash kernel keeps only tiles)
  logits       rows * vocab * e (the last chunk projects every row; the sampler's [:, -1] slice is a
               view that keeps the whole buffer alive)
  overshoot    sliding layers hold window + rows - 1 tokens during a chunk, not window
  transient = activations + scores + logits + overshoot

A speculative model (with_draft) adds its drafter: the drafter's weights to weights_bytes, its KV (always
unquantized) to every stream's, and both caches reach k positions past a stream's depth, since a round
writes its drafts before trimming the rejected ones (caches do not shrink). A drafter prefills apart from its
target, so the transient is the larger of the two models'.

Measured on Linux CPU, dense layout, 512-token chunks, peak over the cache's own growth: SmolLM2
mid-prompt chunk at depth 1024 took 42 MB (formula without logits 61 MB), its last chunk at 1536
took 149 MB (formula 182 MB); Gemma 3 270M's last chunk at 2048 took 563 MB (formula 614 MB).
The scores and the logits do not peak together, so their sum is a safe, not a tight, bound.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Literal, get_args

from gmlx_plan.geometry import Geometry, LayerKV, geometry_from_header
from gmlx_plan.gguf_types import GGML_TYPES, GGUFHeader, TensorInfo, ggml_type_name

Layout = Literal["packed", "dense", "native"]  # how weights are held: the one list of layout names
LayoutChoice = Literal["auto", "packed", "dense", "native"]  # what a config or flag may ask for
LAYOUTS: tuple[Layout, ...] = get_args(Layout)
LAYOUT_CHOICES: tuple[LayoutChoice, ...] = get_args(LayoutChoice)
KVDtype = Literal["float32", "float16"]  # what the unquantized KV caches hold
KVDtypeChoice = Literal["auto", "float32", "float16"]  # a model's kv_dtype
KV_DTYPE_CHOICES: tuple[KVDtypeChoice, ...] = get_args(KVDtypeChoice)
KV_DTYPE_BYTES: dict[KVDtype, int] = {"float32": 4, "float16": 2}
AFFINE_GROUP = 32  # MLX affine group size of every packed weight
KV_STEP = 256  # mlx-vlm's KV caches grow in steps of this many tokens
PREFILL_CHUNK = 512  # gmlx_server/engine/request_run.py
DEFAULT_DRAFT_TOKENS = 4  # tokens a drafter proposes per speculative round (the config's draft_tokens)
MAX_DRAFT_TOKENS = 16
FLOAT_TYPES = frozenset({"F32", "F16", "BF16", "F64"})
# ggml type -> bits of its MLX affine form in the packed layout (exact repack or requantized).
PACKED_BITS: dict[str, int] = {
    "Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q5_0": 5, "Q5_1": 5, "Q5_K": 5, "Q8_0": 8, "Q8_K": 8,
    "Q6_K": 8, "IQ4_NL": 8, "IQ4_XS": 8, "Q3_K": 5, "Q2_K": 4,
    "IQ2_XXS": 8, "IQ2_XS": 8, "IQ2_S": 8, "IQ3_XXS": 8, "IQ3_S": 8, "IQ1_S": 8, "IQ1_M": 8,
    "TQ1_0": 8, "TQ2_0": 8, "MXFP4": 8,
}


class UnsupportedType(ValueError):
    def __init__(self, name: str, type_name: str) -> None:
        super().__init__(f"tensor {name!r} has ggml type {type_name}, which gmlx cannot load")


# The KV cache follows the activations' dtype. Measured: fp32 in both layouts, because the packed
# layout keeps 1-D norm weights in f32 and they promote fp16 activations. Cast them and packed is 2.
ACTIVATION_BYTES: dict[str, int] = {"packed": 4, "dense": 4, "native": 4}
# native layout (CPU kernels): these stay GGUF blocks as stored; other quantized types become Q8_0 blocks.
NATIVE_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"})
_BLOCK = {name: (qk, size) for name, qk, size in GGML_TYPES.values()}


def kv_element_bytes(layout: Layout) -> int:
    return ACTIVATION_BYTES[layout]


def resolve_kv_dtype(choice: KVDtypeChoice, kernels_attend: bool) -> KVDtype:
    """auto: float16 where gmlx's CPU kernels run the attention (they widen fp16 in registers: a long context
    reads half the bytes), else float32 (MLX's own attention would promote a float16 cache on every call)."""
    if choice != "auto":
        return choice
    return "float16" if kernels_attend else "float32"


def converted_bytes(shape: tuple[int, ...], type_name: str, layout: Layout, name: str = "") -> int:
    """Bytes of one GGUF tensor once the engine has converted it for `layout`."""
    if type_name not in FLOAT_TYPES and type_name not in PACKED_BITS:
        raise UnsupportedType(name, type_name)
    n = math.prod(shape)
    if layout == "native" and len(shape) == 2 and type_name in PACKED_BITS:
        qk, size = _BLOCK[type_name if type_name in NATIVE_TYPES else "Q8_0"]
        return n // qk * size
    if layout in ("dense", "native") or (len(shape) < 2 and type_name == "F32"):
        return 4 * n
    if len(shape) >= 2 and type_name in PACKED_BITS:
        return n * PACKED_BITS[type_name] // 8 + (n // AFFINE_GROUP) * 4
    return 2 * n


def weights_by_type(tensors: Iterable[TensorInfo], layout: Layout) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in tensors:
        name = ggml_type_name(t.ggml_type)
        out[name] = out.get(name, 0) + converted_bytes(t.shape, name, layout, t.name)
    return out


def weights_bytes(tensors: Iterable[TensorInfo], layout: Layout) -> int:
    return sum(weights_by_type(tensors, layout).values())


class KVQuantError(ValueError):
    """A kv_quant field out of range; `field` names it."""

    def __init__(self, field: str, what: str) -> None:
        self.field, self.what = field, what
        super().__init__(f"kv quant {field} {what}")


@dataclass(frozen=True)
class KVQuant:
    """KV cache quantization, as the config's kv_quant block says it."""

    scheme: Literal["uniform", "kvarn"]
    bits: int = 4
    group_size: int = 64
    value_bits: int | None = None  # kvarn: value bits (default: bits)
    tail_tokens: int | None = None  # kvarn: the newest tokens kept unquantized
    quantize_sliding: bool = False  # mlx-vlm's RotatingKVCache cannot quantize
    keep_last_layer: bool = False  # mlx-vlm's own policy keeps the last layer of > 2 unquantized; gmlx does not

    def __post_init__(self) -> None:
        if self.scheme not in ("uniform", "kvarn"):
            raise KVQuantError("scheme", f"must be uniform or kvarn, got {self.scheme!r}")
        for name, b in (("bits", self.bits), ("value_bits", self.value_bits)):
            if b is not None and b not in (2, 3, 4, 5, 6, 8):  # what mx.quantize takes
                raise KVQuantError(name, f"must be 2, 3, 4, 5, 6 or 8, got {b}")
        if self.group_size not in (32, 64, 128):
            raise KVQuantError("group_size", f"must be 32, 64 or 128, got {self.group_size}")
        if self.tail_tokens is not None and self.tail_tokens < 0:
            raise KVQuantError("tail_tokens", f"must not be negative, got {self.tail_tokens}")

    @property
    def key_bits(self) -> int:
        return self.bits

    @property
    def val_bits(self) -> int:
        return self.value_bits if self.scheme == "kvarn" and self.value_bits is not None else self.bits

    @property
    def tail(self) -> int:
        return (self.tail_tokens or 0) if self.scheme == "kvarn" else 0


@dataclass(frozen=True)
class LayerCost:
    window: int | None
    plain_per_token: int  # bytes per token unquantized
    quant_per_token: int  # bytes per token quantized (== plain when the layer stays unquantized)
    tail: int  # newest tokens kept unquantized
    quantized: bool


def _quantizable(i: int, layer: LayerKV, n: int, q: KVQuant) -> bool:
    if layer.window is not None and not q.quantize_sliding:
        return False
    if q.keep_last_layer and n > 2 and i == n - 1:
        return False
    return layer.key_dim % q.group_size == 0 and layer.value_dim % q.group_size == 0


def quantized_layers(g: Geometry, q: KVQuant | None) -> tuple[bool, ...]:
    """Which layers the engine builds quantized caches for (gmlx_server/engine/kv_quant.py reads this)."""
    return tuple(q is not None and _quantizable(i, layer, g.n_layers, q) for i, layer in enumerate(g.layers))


def _quant_bytes(dim: int, bits: int, group: int, e: int) -> int:
    return dim * bits // 8 + (dim // group) * 2 * e


def layer_costs(g: Geometry, e: int, q: KVQuant | None, kv_e: int | None = None) -> tuple[LayerCost, ...]:
    """kv_e: the unquantized caches' element bytes (their kv_dtype), e the activations' (quantized layers)."""
    out = []
    for layer, quantized in zip(g.layers, quantized_layers(g, q), strict=True):
        if q is None or not quantized:
            held = layer.kv_elements_per_token * (kv_e or e)
            out.append(LayerCost(layer.window, held, held, 0, False))
            continue
        plain = layer.kv_elements_per_token * e  # a kvarn tail keeps the activation dtype
        per = layer.kv_heads * (_quant_bytes(layer.key_dim, q.key_bits, q.group_size, e)
                                + _quant_bytes(layer.value_dim, q.val_bits, q.group_size, e))
        out.append(LayerCost(layer.window, plain, per, q.tail, True))
    return tuple(out)


def _held(tokens: int, window: int | None, step: int) -> int:
    held = -(-tokens // step) * step if tokens > 0 else 0
    return min(held, window) if window is not None else held


def layer_bytes(c: LayerCost, tokens: int, step: int = KV_STEP) -> int:
    held = _held(tokens, c.window, step)
    if not (c.quantized and c.tail):
        return held * c.quant_per_token  # == plain_per_token when not quantized
    # kvarn: the newest tokens unquantized; the quantized store behind them fills the rest of the held steps
    fp = min(tokens, c.tail, held)
    return fp * c.plain_per_token + (max(0, held - c.tail) if tokens > c.tail else 0) * c.quant_per_token


@dataclass(frozen=True)
class MemoryModel:
    """Everything the capacity formulas need about one loaded model."""

    geometry: Geometry
    layout: Layout
    weights_bytes: int
    kv_quant: KVQuant | None = None
    prefill_chunk: int = PREFILL_CHUNK
    kv_step: int = KV_STEP
    fused_attention: bool = False  # True on Metal when fused_prefill_supported(geometry)
    act_bytes: int | None = None  # activation element bytes; None = ACTIVATION_BYTES[layout]
    draft: DraftCost | None = None  # a speculative model's drafter (weights_bytes then counts both models)
    kv_dtype_bytes: int | None = None  # unquantized KV element bytes (kv_dtype); None = the activations'

    @property
    def element_bytes(self) -> int:
        return self.act_bytes or kv_element_bytes(self.layout)

    @property
    def kv_element_bytes(self) -> int:
        return self.kv_dtype_bytes or self.element_bytes

    @cached_property
    def costs(self) -> tuple[LayerCost, ...]:
        return layer_costs(self.geometry, self.element_bytes, self.kv_quant, self.kv_dtype_bytes)


@dataclass(frozen=True)
class DraftCost:
    """A speculative model's drafter: its own memory model (unquantized KV), its name, and the k tokens a round
    drafts (how far past a stream's depth both models' caches reach)."""

    model: MemoryModel
    name: str
    tokens: int


def with_draft(m: MemoryModel, draft: MemoryModel, name: str, tokens: int) -> MemoryModel:
    """`m` with a drafter beside it: what the server's capacity table and `gmlx plan` budget for a `draft:`."""
    if draft.kv_quant is not None or draft.draft is not None:
        raise ValueError("a drafter's KV is unquantized and it drafts for nobody")
    return replace(m, weights_bytes=m.weights_bytes + draft.weights_bytes, draft=DraftCost(draft, name, tokens))


def fused_prefill_supported(g: Geometry) -> bool:
    """MLX's Metal flash-attention kernel serves prefill only for these head dims; others fall back."""
    return all(layer.key_dim == layer.value_dim and layer.key_dim in (64, 80, 128) for layer in g.layers)


def memory_model(g: Geometry, tensors: Iterable[TensorInfo], layout: Layout, kv_quant: KVQuant | None = None,
                 prefill_chunk: int = PREFILL_CHUNK, weights: int | None = None, metal: bool = False,
                 act_bytes: int | None = None, kv_dtype_bytes: int | None = None) -> MemoryModel:
    """`weights` overrides the header formula (the server may pass its load report's total);
    metal: the model runs on the GPU, so prefill attention is fused where MLX supports it;
    act_bytes: the activation dtype's size when the caller knows it; kv_dtype_bytes: the plain KV caches'."""
    w = weights_bytes(tensors, layout) if weights is None else weights
    return MemoryModel(g, layout, w, kv_quant, prefill_chunk, fused_attention=metal and fused_prefill_supported(g),
                       act_bytes=act_bytes, kv_dtype_bytes=kv_dtype_bytes)


def model_from_header(h: GGUFHeader, layout: Layout, kv_quant: KVQuant | None = None,
                      prefill_chunk: int = PREFILL_CHUNK, weights: int | None = None,
                      metal: bool = False, act_bytes: int | None = None,
                      kv_dtype_bytes: int | None = None) -> MemoryModel:
    return memory_model(geometry_from_header(h), h.tensors, layout, kv_quant, prefill_chunk, weights, metal,
                        act_bytes, kv_dtype_bytes)


def model_with_draft(m: MemoryModel, header: GGUFHeader, layout: Layout, name: str, tokens: int,
                     metal: bool = False) -> MemoryModel:
    """`m` with the drafter whose GGUF header is given, in the same activation and KV dtypes and prefill chunk."""
    draft = model_from_header(header, layout, None, m.prefill_chunk, metal=metal, act_bytes=m.act_bytes,
                              kv_dtype_bytes=m.kv_dtype_bytes)
    return with_draft(m, draft, name, tokens)


def kv_bytes(m: MemoryModel, tokens: int) -> int:
    """One stream's KV cache at `tokens` tokens, every layer (and its drafter's, k tokens further)."""
    if m.draft is None or tokens <= 0:
        return sum(layer_bytes(c, tokens, m.kv_step) for c in m.costs)
    reach = tokens + m.draft.tokens
    return sum(layer_bytes(c, reach, m.kv_step) for c in m.costs) + kv_bytes(m.draft.model, reach)


def kv_bytes_per_token(m: MemoryModel, beyond_window: bool = False) -> int:
    """A long context's bytes per token (quantized rate past the kvarn tail); beyond_window: full layers only."""
    own = sum(c.quant_per_token for c in m.costs if not (beyond_window and c.window is not None))
    return own + (kv_bytes_per_token(m.draft.model, beyond_window) if m.draft is not None else 0)


def transient_bytes(m: MemoryModel, rows: int, depth: int) -> int:
    """Peak working set beside weights and KV while `rows` query rows ending at `depth` run (see above)."""
    g, e = m.geometry, m.element_bytes
    if rows <= 0 or depth <= 0:
        return 0
    if m.draft is not None:  # the drafter's passes run apart from the target's
        return max(transient_bytes(replace(m, draft=None), rows, depth), transient_bytes(m.draft.model, rows, depth))
    act = rows * e * (4 * g.hidden + 2 * g.q_dim + 2 * g.kv_dim + 3 * g.ffn)
    keys = max(depth if c.window is None else min(depth, c.window + rows - 1) for c in m.costs)
    scores = 0 if m.fused_attention else rows * g.n_heads * keys * (2 * e + 1)
    logits = rows * g.vocab * e
    overshoot = sum(c.plain_per_token * max(0, min(depth, c.window + rows - 1) - min(depth, c.window))
                    for c in m.costs if c.window is not None)
    return act + scores + logits + overshoot


def footprint(m: MemoryModel, width: int, depth: int) -> int:
    """Weights + `width` streams of KV at `depth` + the worst transient while they run.

    The transient is the larger of a prefill chunk (min(chunk, depth) rows) and a decode step
    (`width` rows), both attending `depth` keys.
    """
    if width <= 0 or depth <= 0:
        return m.weights_bytes
    rows = max(min(m.prefill_chunk, depth), width)
    return m.weights_bytes + width * kv_bytes(m, depth) + transient_bytes(m, rows, depth)


def need_bytes(m: MemoryModel, prompt_tokens: int, max_tokens: int | None = None, warm_tokens: int = 0) -> int:
    """POST /v1/estimate's need_bytes: the prefill transient plus KV for the prompt (and max_tokens if pinned).

    The cache already holds `warm_tokens` of the prompt, so the chunk prefilled last is at most
    prompt - warm tokens; KV covers the whole prompt either way.
    """
    depth = prompt_tokens + (max_tokens or 0)
    cold = max(1, prompt_tokens - warm_tokens)
    return kv_bytes(m, depth) + transient_bytes(m, min(m.prefill_chunk, cold), max(prompt_tokens, 1))
