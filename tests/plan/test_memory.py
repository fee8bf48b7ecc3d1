"""Weights, KV and transient formulas: against the engine's measured load figures and by hand."""

from __future__ import annotations

import pytest

from gmlx_plan.geometry import Geometry, LayerKV, geometry_from_header
from gmlx_plan.gguf_header import read_header
from gmlx_plan.memory import (
    KVQuant,
    MemoryModel,
    UnsupportedType,
    converted_bytes,
    kv_bytes,
    kv_bytes_per_token,
    layer_costs,
    model_from_header,
    need_bytes,
    resolve_kv_dtype,
    transient_bytes,
    weights_by_type,
    weights_bytes,
)
from tests.conftest import gemma_path, smollm2_path

# The engine's load reports (gmlx_server/engine/gguf_tensors.py LoadReport), in MB.
ENGINE_MB = {("smollm2", "packed"): 98.3, ("smollm2", "dense"): 538.1,
             ("gemma", "packed"): 266.2, ("gemma", "dense"): 1072.4}


def _path(name: str) -> str:
    return smollm2_path() if name == "smollm2" else gemma_path()


@pytest.mark.parametrize(("name", "layout"), list(ENGINE_MB))
def test_weights_match_the_engine_load_report_within_1_percent(name: str, layout: str) -> None:
    got = weights_bytes(read_header(_path(name), strings=False).tensors, layout)  # type: ignore[arg-type]
    assert got / 1e6 == pytest.approx(ENGINE_MB[(name, layout)], rel=0.01)


def test_smollm2_packed_by_type_matches_the_engine() -> None:
    by = weights_by_type(read_header(smollm2_path(), strings=False).tensors, "packed")
    assert {k: round(v / 1e6, 1) for k, v in by.items()} == {"Q4_1": 66.4, "Q8_0": 31.9, "F32": 0.1}


def test_gemma3_geometry_has_sliding_windows_every_sixth_layer_full() -> None:
    g = geometry_from_header(read_header(gemma_path(), strings=False))
    assert (g.architecture, g.n_layers, g.context_length) == ("gemma3", 18, 32768)
    assert [i for i, layer in enumerate(g.layers) if layer.window is None] == [5, 11, 17]
    assert {layer.window for layer in g.layers if layer.window} == {512}
    assert {(layer.kv_heads, layer.key_dim, layer.value_dim) for layer in g.layers} == {(1, 256, 256)}
    assert g.vocab == 262144


def test_smollm2_geometry_is_gqa_with_rope_head_dim() -> None:
    g = geometry_from_header(read_header(smollm2_path(), strings=False))
    assert (g.n_layers, g.n_heads, g.hidden, g.ffn, g.vocab) == (30, 9, 576, 1536, 49152)
    assert {(layer.kv_heads, layer.key_dim) for layer in g.layers} == {(3, 64)}
    m = model_from_header(read_header(smollm2_path(), strings=False), "packed")
    assert kv_bytes_per_token(m) == 30 * 3 * (64 + 64) * 4  # fp32: the engine's activations in both layouts


@pytest.mark.parametrize(("shape", "type_name", "layout", "expected"), [
    ((256, 4), "Q4_K", "packed", 1024 // 2 + 1024 // 32 * 4),
    ((256, 4), "Q6_K", "packed", 1024 + 1024 // 32 * 4),  # requantized to 8 bits
    ((256, 4), "Q3_K", "packed", 1024 * 5 // 8 + 1024 // 32 * 4),
    ((256, 4), "Q2_K", "packed", 1024 // 2 + 1024 // 32 * 4),
    ((32, 4), "IQ4_NL", "packed", 128 + 128 // 32 * 4),
    ((64, 4), "F16", "packed", 512), ((64, 4), "F32", "packed", 512), ((64, 4), "BF16", "dense", 1024),
    ((64,), "F32", "packed", 256), ((64,), "F16", "packed", 128), ((64,), "F16", "dense", 256),
    ((256, 4), "Q4_K", "dense", 4096),
])
def test_converted_bytes_per_type(shape: tuple[int, ...], type_name: str, layout: str, expected: int) -> None:
    assert converted_bytes(shape, type_name, layout) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("type_name", ["Q8_1", "I32", "type99"])
def test_types_the_engine_cannot_load_are_refused(type_name: str) -> None:
    with pytest.raises(UnsupportedType, match=type_name):
        converted_bytes((32, 2), type_name, "packed", "w")


def _geo(layers: tuple[LayerKV, ...], heads: int = 8, vocab: int = 1000, ctx: int = 1 << 16) -> Geometry:
    return Geometry("test", heads, 512, 1024, vocab, ctx, layers)


def test_kv_rounds_to_the_cache_step_and_caps_sliding_layers_at_their_window() -> None:
    g = _geo((LayerKV(2, 64, 64, None), LayerKV(2, 64, 64, 300)))
    m = MemoryModel(g, "packed", 0, act_bytes=2)
    per = 2 * 128 * 2  # kv heads * (key + value) * fp16
    assert kv_bytes(m, 1) == 2 * 256 * per
    assert kv_bytes(m, 257) == (512 + 300) * per
    assert kv_bytes(m, 1000) == (1024 + 300) * per
    dense = MemoryModel(g, "dense", 0)
    assert kv_bytes(dense, 1000) == 2 * kv_bytes(m, 1000)  # fp32 KV in the dense layout
    assert kv_bytes(MemoryModel(g, "packed", 0), 1000) == kv_bytes(dense, 1000)  # and, measured, when packed


def test_uniform_quant_bytes_and_which_layers_quantize() -> None:
    g = _geo((LayerKV(2, 64, 64, None), LayerKV(2, 64, 64, 512), LayerKV(2, 96, 96, None),
              LayerKV(2, 64, 64, None), LayerKV(2, 64, 64, None)))
    costs = layer_costs(g, 2, KVQuant("uniform", 8, 64))
    # sliding: no quantized RotatingKVCache; 96 % 64 != 0; the last layer quantizes too (gmlx's choice)
    assert [c.quantized for c in costs] == [True, False, False, True, True]
    assert costs[0].quant_per_token == 2 * 2 * (64 * 8 // 8 + 1 * 2 * 2)
    assert not layer_costs(g, 2, KVQuant("uniform", 8, 64, keep_last_layer=True))[4].quantized  # mlx-vlm's policy


def test_kvarn_keeps_the_tail_unquantized() -> None:
    g = _geo((LayerKV(1, 128, 128, None),) * 2)
    m = MemoryModel(g, "packed", 0, KVQuant("kvarn", 4, 64, value_bits=2, tail_tokens=128), act_bytes=2)
    plain, quant = 1 * 256 * 2, (128 * 4 // 8 + 2 * 4) + (128 * 2 // 8 + 2 * 4)
    assert kv_bytes(m, 100) == 2 * 100 * plain  # within the tail: nothing quantized yet
    assert kv_bytes(m, 129) == 2 * (128 * plain + 128 * quant)  # 256 held: the newest 128 plain
    assert kv_bytes(m, 1024) == 2 * (128 * plain + (1024 - 128) * quant)


def test_float16_kv_halves_the_unquantized_layers_only() -> None:
    """kv_dtype float16: plain and sliding layers at 2 bytes an element; a quantized layer's scales and a kvarn
    tail keep the activations' dtype (mx.quantize and the tail take the fp32 keys as they come)."""
    g = _geo((LayerKV(2, 64, 64, None), LayerKV(2, 64, 64, 300)))
    fp32, half = MemoryModel(g, "native", 0), MemoryModel(g, "native", 0, kv_dtype_bytes=2)
    assert 2 * kv_bytes(half, 1000) == kv_bytes(fp32, 1000) and (half.kv_element_bytes, half.element_bytes) == (2, 4)
    assert 2 * kv_bytes_per_token(half) == kv_bytes_per_token(fp32)
    q8, kvarn = KVQuant("uniform", 8, 64), KVQuant("kvarn", 4, 64, value_bits=2, tail_tokens=16)
    assert layer_costs(g, 4, q8, 2)[0] == layer_costs(g, 4, q8)[0]
    assert layer_costs(g, 4, q8, 2)[1].quant_per_token == 2 * 128 * 2  # the sliding layer stays plain: float16
    assert layer_costs(g, 4, kvarn, 2)[0].plain_per_token == 2 * 128 * 4
    assert resolve_kv_dtype("auto", kernels_attend=True) == "float16"
    assert resolve_kv_dtype("auto", kernels_attend=False) == "float32"
    assert resolve_kv_dtype("float32", kernels_attend=True) == "float32"


def test_transient_formula_by_hand() -> None:
    g = _geo((LayerKV(2, 64, 64, None),), heads=8, vocab=1000)
    m = MemoryModel(g, "packed", 0, prefill_chunk=16, act_bytes=2)
    act, logits = 16 * 2 * (4 * 512 + 2 * 8 * 64 + 2 * 2 * 128 + 3 * 1024), 16 * 1000 * 2
    assert transient_bytes(m, 16, 4096) == act + 16 * 8 * 4096 * 5 + logits  # scores: 2 e + 1 bytes each
    assert transient_bytes(m, 16, 10) == act + 16 * 8 * 10 * 5 + logits
    fused = MemoryModel(g, "packed", 0, prefill_chunk=16, fused_attention=True, act_bytes=2)
    assert transient_bytes(fused, 16, 4096) == act + logits
    dense = MemoryModel(g, "dense", 0, prefill_chunk=16)
    assert transient_bytes(dense, 16, 10) == 2 * act + 16 * 8 * 10 * 9 + 2 * logits


def test_sliding_layers_overshoot_their_window_during_a_chunk() -> None:
    g = _geo((LayerKV(1, 64, 64, 100),), heads=1, vocab=1)
    m = MemoryModel(g, "packed", 0, fused_attention=True, act_bytes=2)
    base = transient_bytes(m, 32, 50)  # below the window: no overshoot
    assert transient_bytes(m, 32, 5000) - base == 31 * 256


def test_need_bytes_counts_prompt_and_max_tokens_and_warm_prefix() -> None:
    g = _geo((LayerKV(2, 64, 64, None),) * 4)
    m = MemoryModel(g, "packed", 0, prefill_chunk=512)
    assert need_bytes(m, 1000) == kv_bytes(m, 1000) + transient_bytes(m, 512, 1000)
    assert need_bytes(m, 1000, 500) == kv_bytes(m, 1500) + transient_bytes(m, 512, 1000)
    assert need_bytes(m, 1000, warm_tokens=990) == kv_bytes(m, 1000) + transient_bytes(m, 10, 1000)


@pytest.mark.parametrize("bad", [dict(bits=1), dict(bits=7), dict(group_size=16), dict(tail_tokens=-1)])
def test_kv_quant_validates(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        KVQuant("uniform", **bad)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "layout"), list(ENGINE_MB))
def test_weights_equal_the_real_conversion_byte_for_byte(name: str, layout: str) -> None:
    from gmlx_server.engine.gguf_tensors import load_gguf_tensors

    header = read_header(_path(name))
    _, report = load_gguf_tensors(header.path, header.tensors, layout)  # type: ignore[arg-type]
    assert report.total_bytes == weights_bytes(header.tensors, layout)  # type: ignore[arg-type]
    by_source: dict[str, int] = {}
    for (src, _), entry in report.by_type.items():
        by_source[src] = by_source.get(src, 0) + entry.nbytes
    assert by_source == weights_by_type(header.tensors, layout)  # type: ignore[arg-type]
