"""GGUF facts have one source, the planner's: the engine's mlx-vlm config takes head sizes, windows, vocabulary
and the context default from gmlx_plan.geometry, so the capacity table budgets the model the engine builds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from gmlx_plan import geometry, memory
from gmlx_plan.gguf_header import read_header
from gmlx_server.config.settings import KVQuant as ConfigKVQuant
from gmlx_server.engine import request_run
from gmlx_server.engine.arch import ARCHS, arch_spec, vocab_size
from tests.conftest import gemma_path, smollm2_path
from tests.gguf_factory import FakeTensor, write_gguf


def _engine_view(path: str | Path) -> tuple[dict[str, object], geometry.Geometry]:
    h = read_header(path)
    cfg = arch_spec(h).build_config(h, vocab_size(h))
    return cfg, geometry.geometry_from_header(h)


def _assert_same(cfg: dict[str, object], geo: geometry.Geometry) -> None:
    head = cfg.get("head_dim") or int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])  # type: ignore[call-overload]
    assert head == geo.layers[0].key_dim
    assert cfg["vocab_size"] == geo.vocab and cfg["max_position_embeddings"] == geo.context_length
    windows = {layer.window for layer in geo.layers if layer.window is not None}
    assert windows == ({cfg["sliding_window"]} if "sliding_window" in cfg else set())


@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_the_real_models_engine_config_is_the_planners_geometry(which: str) -> None:
    _assert_same(*_engine_view(smollm2_path() if which == "smollm2" else gemma_path()))


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("extra", [{}, {"attention.key_length": 24, "attention.value_length": 24},
                                   {"rope.dimension_count": 16}, {"vocab_size": 77}])
def test_edge_headers_agree_too(arch: str, extra: dict[str, int], tmp_path: Path) -> None:
    """Heads that key_length or rope.dimension_count override, no context_length, a 1-D token table."""
    meta = {f"{arch}.{k}": v for k, v in {"block_count": 2, "embedding_length": 64, "feed_forward_length": 128,
                                          "attention.head_count": 4, "attention.head_count_kv": 2, **extra}.items()}
    path = write_gguf(tmp_path / "m.gguf", [FakeTensor("token_embd.weight", np.zeros((77, 64), np.float32), QT.F32)],
                      arch=arch, metadata=meta)
    _assert_same(*_engine_view(path))


def test_the_shared_constants_are_the_planners() -> None:
    assert request_run.PREFILL_CHUNK is memory.PREFILL_CHUNK
    assert ConfigKVQuant is memory.KVQuant


@pytest.mark.parametrize("name, row, template", [
    ("gemma3", "gemma", "gemma"), ("gemma3_text", "gemma", "gemma"), ("qwen2", "qwen", "chatml"),
    ("Qwen3", "qwen", "chatml"), ("llama", "llama", None), ("SmolLM2", "llama", None), ("mixtral", "mistral", None),
    ("phi3", "default", None),
])
def test_one_family_record_serves_every_reader(name: str, row: str, template: str | None) -> None:
    """The intents row, the built-in template and the architecture table all come from gmlx_plan.families."""
    from gmlx_plan.families import family_of
    from gmlx_server.engine.chat_template import fallback_family
    from gmlx_server.serving.intents import table_family

    assert table_family(name) == family_of(name).name == row
    assert family_of(name).template == template
    if template is not None:
        assert fallback_family(name, ()) == template
    for arch, spec in ARCHS.items():
        assert spec.family == family_of(arch).name


@pytest.mark.parametrize("type_name", sorted(memory.PACKED_BITS))
def test_the_engine_converts_every_type_to_the_bytes_the_planner_sizes(type_name: str, tmp_path: Path) -> None:
    """PACKED_BITS (and the native block table) are what the engine's converter makes of each type, per layout."""
    from gmlx_server.engine.gguf_tensors import load_gguf_tensors
    from tests.gguf_factory import random_blocks

    qtype = QT[type_name]
    raw = random_blocks(qtype, (64, 256), np.random.default_rng(qtype.value))
    path = write_gguf(tmp_path / "t.gguf", [FakeTensor("blk.0.attn_q.weight", raw, qtype)])
    info = read_header(path).tensors[0]
    for layout in memory.LAYOUTS:
        tensors, _ = load_gguf_tensors(path, [info], layout)
        t = tensors[info.name]
        assert t.nbytes == memory.converted_bytes(info.shape, type_name, layout)
        assert t.bits == (memory.PACKED_BITS[type_name] if layout == "packed" else None)


def test_the_header_readers_type_table_is_ggufs() -> None:
    """Ids, names and block geometry agree with the gguf library's (Q8_1 aside: gguf-py keeps its old fp32
    scales, 40 bytes, where llama.cpp's block_q8_1 holds two fp16, 36; no file stores Q8_1)."""
    from gguf.constants import GGML_QUANT_SIZES

    from gmlx_plan.gguf_header import GGML_TYPES

    for type_id, (name, block, size) in GGML_TYPES.items():
        assert QT(type_id).name == name
        assert GGML_QUANT_SIZES[QT(type_id)] == (block, size) or name == "Q8_1"


def _cpp_constants(header: str, prefix: str) -> dict[str, tuple[int, int]]:
    """`struct <prefix>Q4_K { static constexpr int QK = 256, BYTES = 144, ...` -> {"Q4_K": (256, 144)}."""
    import re

    found = re.findall("struct " + prefix + r"(Q\w+) \{\s*static constexpr int QK = (\d+), BYTES = (\d+)", header)
    return {name: (int(qk), int(size)) for name, qk, size in found}


def test_ggml_type_facts_have_one_table() -> None:
    """Type ids and block geometry: the header reader's table; the C++ enum and format structs say the same."""
    import re

    from gmlx_plan.gguf_header import GGML_TYPES
    from gmlx_server.engine.kernels import NATIVE_TYPES

    src = Path(__file__).resolve().parents[2] / "gmlx_server/engine/kernels/src"
    formats, floats = (src / "formats.h").read_text(), (src / "floats.h").read_text()
    enum = re.search(r"enum QType : int \{([^}]*)\}", formats)
    assert enum is not None
    in_cpp = {k.strip(): int(v) for k, v in (item.split("=") for item in enum.group(1).split(","))}
    assert in_cpp == NATIVE_TYPES and set(NATIVE_TYPES) == memory.NATIVE_TYPES
    assert all(GGML_TYPES[i][0] == name for name, i in NATIVE_TYPES.items())
    blocks = {name: GGML_TYPES[i][1:] for name, i in NATIVE_TYPES.items()}
    assert _cpp_constants(formats, "F") == blocks == _cpp_constants(floats, "D")
