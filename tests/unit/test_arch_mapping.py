"""Every supported architecture's GGUF names and metadata map onto its mlx-vlm class (strict load, forward pass).

Tiny random models written with gguf's writer: llama, qwen2 (attention biases), qwen3 (q/k norms),
gemma3 (four norms per block, sliding layers). No real weights are needed to prove the mapping.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from gmlx_plan.gguf_header import read_header
from gmlx_server.engine.arch import ARCHS, arch_spec, make_cache, vocab_size
from gmlx_server.engine.gguf_tensors import load_gguf_tensors
from gmlx_server.engine.weights import install_weights, transpose_dense_linears
from tests.gguf_factory import FakeTensor, write_gguf

HIDDEN, HEADS, KV, HEAD_DIM, FFN, VOCAB, LAYERS = 64, 4, 2, 16, 96, 128, 6  # 6: one full gemma3 pattern


def _tensors(arch: str, rng: np.random.Generator) -> list[FakeTensor]:
    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    out = [FakeTensor("token_embd.weight", w(VOCAB, HIDDEN), QT.F32),
           FakeTensor("output_norm.weight", np.ones(HIDDEN, np.float32), QT.F32)]
    for i in range(LAYERS):
        b = f"blk.{i}."
        out += [FakeTensor(b + "attn_norm.weight", np.ones(HIDDEN, np.float32), QT.F32),
                FakeTensor(b + "ffn_norm.weight", np.ones(HIDDEN, np.float32), QT.F32),
                FakeTensor(b + "attn_q.weight", w(HEADS * HEAD_DIM, HIDDEN), QT.F32),
                FakeTensor(b + "attn_k.weight", w(KV * HEAD_DIM, HIDDEN), QT.F32),
                FakeTensor(b + "attn_v.weight", w(KV * HEAD_DIM, HIDDEN), QT.F32),
                FakeTensor(b + "attn_output.weight", w(HIDDEN, HEADS * HEAD_DIM), QT.F32),
                FakeTensor(b + "ffn_gate.weight", w(FFN, HIDDEN), QT.F32),
                FakeTensor(b + "ffn_up.weight", w(FFN, HIDDEN), QT.F32),
                FakeTensor(b + "ffn_down.weight", w(HIDDEN, FFN), QT.F32)]
        if arch == "qwen2":
            out += [FakeTensor(b + f"attn_{p}.bias", w(n * HEAD_DIM), QT.F32) for p, n in (("q", HEADS), ("k", KV),
                                                                                           ("v", KV))]
        if arch in ("qwen3", "gemma3"):
            out += [FakeTensor(b + f"attn_{p}_norm.weight", np.ones(HEAD_DIM, np.float32), QT.F32) for p in "qk"]
        if arch == "gemma3":
            out += [FakeTensor(b + "post_attention_norm.weight", np.ones(HIDDEN, np.float32), QT.F32),
                    FakeTensor(b + "post_ffw_norm.weight", np.ones(HIDDEN, np.float32), QT.F32)]
    return out


def _metadata(arch: str) -> dict[str, object]:
    meta: dict[str, object] = {f"{arch}.{k}": v for k, v in {
        "block_count": LAYERS, "context_length": 256, "embedding_length": HIDDEN, "feed_forward_length": FFN,
        "attention.head_count": HEADS, "attention.head_count_kv": KV, "attention.key_length": HEAD_DIM,
        "attention.value_length": HEAD_DIM, "rope.dimension_count": HEAD_DIM, "rope.freq_base": 10000.0,
        "attention.layer_norm_rms_epsilon": 1e-6}.items()}
    if arch == "gemma3":
        meta["gemma3.attention.sliding_window"] = 8
    return meta


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_tiny_model_loads_strictly_and_runs(arch: str, tmp_path: Path) -> None:
    path = write_gguf(tmp_path / f"{arch}.gguf", _tensors(arch, np.random.default_rng(0)), arch=arch,
                      metadata=_metadata(arch))
    header = read_header(path)
    spec = arch_spec(header)
    model = spec.model_class()(spec.make_config(spec.build_config(header, vocab_size(header))))
    outs = []
    for layout in ("dense", "packed"):
        tensors, _ = load_gguf_tensors(path, header.tensors, layout)
        model = spec.model_class()(spec.make_config(spec.build_config(header, vocab_size(header))))
        install_weights(model, spec, tensors)  # load_weights(strict=True): every name must land
        if layout == "dense":
            transpose_dense_linears(model)
        ids = mx.array([[1, 5, 9, 3, 7, 2, 11, 4, 6, 8, 10, 12]])  # longer than gemma3's 8-token window
        logits = model(ids, cache=make_cache(model)).logits
        assert logits.shape == (1, 12, VOCAB) and bool(mx.all(mx.isfinite(logits)).item())
        outs.append(logits)
    # Float weights are fp32 in dense and fp16 in packed: the two paths agree to fp16 rounding.
    assert float(mx.max(mx.abs(outs[0] - outs[1])).item()) < 1e-2
