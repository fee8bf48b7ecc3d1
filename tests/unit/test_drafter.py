"""Loading a drafter beside its target: SmolLM2 drafts for itself in another layout, with unquantized KV
whatever the target's kv_quant; a drafter with another token list is refused before any weights load; MLX
allocates what the planner budgets for the pair (weights, and both models' KV k tokens past the depth)."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from mlx_vlm.models.cache import KVCache, QuantizedKVCache

from gmlx_plan.memory import KV_DTYPE_BYTES, KVQuant, kv_bytes, model_from_header, model_with_draft
from gmlx_server.config import Draft
from gmlx_server.engine.drafter import Drafter, DrafterMismatch, load_drafter, with_drafter
from gmlx_server.engine.kv_half import F16KVCache
from gmlx_server.engine.loader import LoadedModel, load_gguf_model
from tests.conftest import smollm2_path
from tests.gguf_factory import FakeTensor, write_gguf

pytestmark = pytest.mark.slow
DEPTH = 200  # tokens in both caches before the round


@pytest.fixture(scope="module")
def target() -> LoadedModel:
    return load_gguf_model(smollm2_path(), model_id="smollm2", layout="dense", kv_quant=KVQuant("uniform", 8, 64))


@pytest.fixture(scope="module")
def drafter(target: LoadedModel) -> Drafter:
    return load_drafter(target, Draft(smollm2_path(), "smol-packed", 3, "packed"))


def test_a_model_drafts_for_itself_in_another_layout(target: LoadedModel, drafter: Drafter) -> None:
    assert (drafter.model_id, drafter.tokens, drafter.loaded.info.weights_layout) == ("smol-packed", 3, "packed")
    assert target.info.weights_layout == "dense" and drafter.context_length == target.info.context_length
    assert drafter.vocab == 49152 and drafter.weights_bytes < target.info.weights_bytes
    plain = F16KVCache if target.info.kv_dtype == "float16" else KVCache  # unquantized, in the target's kv_dtype
    assert drafter.loaded.info.kv_dtype == target.info.kv_dtype
    assert all(type(c) is plain for c in drafter.make_cache())  # the target's uniform KV is its own
    assert all(type(c) is QuantizedKVCache for c in target.make_cache())


def test_a_speculative_model_reports_both_weights(target: LoadedModel, drafter: Drafter) -> None:
    info = with_drafter(target.info, drafter)
    assert info.drafts and not target.info.drafts
    assert info.weights_bytes == target.info.weights_bytes + drafter.weights_bytes


def test_another_token_list_is_refused_naming_both_files(target: LoadedModel, tmp_path: Path) -> None:
    meta = {f"llama.{k}": v for k, v in {"block_count": 1, "embedding_length": 64, "attention.head_count": 4}.items()}
    path = write_gguf(tmp_path / "other.gguf", [FakeTensor("token_embd.weight", np.zeros((3, 64), np.float32), QT.F32)],
                      metadata=meta | {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "c"]})
    with pytest.raises(DrafterMismatch) as e:
        load_drafter(target, Draft(str(path), "other"))
    assert str(path) in str(e.value) and smollm2_path() in str(e.value) and "has 3 tokens" in str(e.value)


def test_mlx_allocates_what_the_planner_budgets_for_the_pair(target: LoadedModel) -> None:
    """The drafter's weights as loaded, and after a round at depth 200 (k = 3 written past it, then trimmed)
    both models' caches, against gmlx_plan's figures for the pair: within 5%. (Depth 600 cost 95 s: the
    packed layout prefills at a few tokens a second outside the engine's chunked path.)"""
    from gmlx_server.engine.cache_trim import trim

    mx.clear_cache()
    base = mx.get_active_memory()
    drafter = load_drafter(target, Draft(smollm2_path(), "smol-packed", 3, "packed"))
    loaded_bytes = mx.get_active_memory() - base
    kv = KV_DTYPE_BYTES[target.info.kv_dtype]  # as the server's capacity table counts it
    planned = model_with_draft(model_from_header(target.header, "dense", KVQuant("uniform", 8, 64), kv_dtype_bytes=kv),
                               drafter.loaded.header, "packed", "smol-packed", 3)
    assert planned.draft is not None and 0.95 <= loaded_bytes / planned.draft.model.weights_bytes <= 1.05
    ids = mx.array([list(range(100, 100 + DEPTH))])
    base = mx.get_active_memory()
    caches = (target.make_cache(), drafter.make_cache())
    for model, cache, extra in ((target.model, caches[0], 4), (drafter.model, caches[1], 3)):
        model(ids, cache=cache)
        model(mx.array([[5] * extra]), cache=cache)  # the round's writes past the depth
        mx.eval([c.state for c in cache])
        assert trim(cache, extra - 1)
    measured = mx.get_active_memory() - base
    assert 0.95 <= measured / kv_bytes(planned, DEPTH) <= 1.05, (measured, kv_bytes(planned, DEPTH))
