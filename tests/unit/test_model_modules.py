"""The gmlx modules a load swaps into one model (engine/kernels/fast_ops.py, engine/attention.py), per family and
RoPE kind: every norm, RoPE, gated MLP and attention instance is swapped, and the model's logits stay those of
mlx-vlm's own modules (within the primitives' float32 error)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_map

from gmlx_server.engine.arch import ARCHS, make_cache
from gmlx_server.engine.attention import use_gmlx_attention
from gmlx_server.engine.kernels import fast_ops

BASE = {"hidden_size": 128, "num_hidden_layers": 2, "intermediate_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "vocab_size": 300, "max_position_embeddings": 4096,
        "head_dim": 32, "tie_word_embeddings": True, "rope_theta": 10000.0}
CASES = {
    "llama": ("llama", {"model_type": "llama", "rope_traditional": True}),
    "llama3-rope": ("llama", {"model_type": "llama", "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 1024}}),
    "yarn-rope": ("qwen2", {"model_type": "qwen2", "rope_scaling": {
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "mscale": 1.2}}),
    "qwen2": ("qwen2", {"model_type": "qwen2"}),
    "qwen3": ("qwen3", {"model_type": "qwen3"}),
    "gemma3": ("gemma3", {"model_type": "gemma3_text", "sliding_window": 8, "sliding_window_pattern": 2,
                          "query_pre_attn_scalar": 32.0, "rope_global_base_freq": 1e6, "rope_local_base_freq": 1e4}),
}


def _model(arch: str, extra: dict[str, Any]) -> Any:
    spec = ARCHS[arch]
    model = spec.model_class()(spec.make_config(BASE | extra))
    mx.random.seed(11)
    model.update(tree_map(lambda a: mx.random.normal(a.shape) * 0.2, model.parameters()))
    return model


def _logits(model: Any) -> mx.array:
    cache = make_cache(model)
    first = model(mx.array([list(range(3, 23))]), cache=cache).logits[0]  # past gemma's window of 8
    return mx.concatenate([first, model(mx.array([[5]]), cache=cache).logits[0]])


@pytest.mark.parametrize("case", list(CASES))
def test_each_family_swapped_keeps_its_logits(ext: ModuleType, case: str) -> None:
    arch, extra = CASES[case]
    theirs, ours = _model(arch, extra), _model(arch, extra)
    want = _logits(theirs)
    prims = fast_ops.Primitives(ext)
    swapped = fast_ops.use_kernel_modules(ours, prims)
    layers = BASE["num_hidden_layers"]
    assert use_gmlx_attention(ours, cpu=True, prims=prims) == layers
    kinds = [type(m) for _, m in ours.named_modules()]
    assert kinds.count(fast_ops.RoPE) == kinds.count(fast_ops.GatedMLP) == layers
    assert nn.RMSNorm not in kinds and not any(k.__name__ == "RMSNorm" and k is not fast_ops.RMSNorm for k in kinds)
    assert swapped == kinds.count(fast_ops.RMSNorm) + 2 * layers
    got = _logits(ours)
    assert mx.abs(got - want).max().item() < 1e-3 * max(1.0, mx.abs(want).max().item())
    prims.ext = None  # the same modules on MLX's own ops: the family's result, bit for bit but the attention
    assert mx.abs(_logits(ours) - want).max().item() < 1e-4 * max(1.0, mx.abs(want).max().item())
