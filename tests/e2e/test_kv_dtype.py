"""kv_dtype on the real models: float16 KV caches give fp32 KV's greedy text, batch as they run alone, and restore
from the prompt cache as their cold run. With the kernels these run GKSDPA over float16 caches; the
GMLX_NATIVE_KERNELS=0 rerun (kernels_off) runs MLX's own attention over them (its matmuls promote them)."""

from __future__ import annotations

import pytest

from gmlx_plan.memory import KVDtypeChoice
from gmlx_server.engine.loader import load_gguf_model
from gmlx_server.engine.mlx_engine import MLXEngine
from tests.conftest import gemma_path, native_kernels, smollm2_path
from tests.e2e.test_batching import _check
from tests.e2e.test_prompt_cache import _hits, _run

pytestmark = pytest.mark.slow
TEXT = "In a quiet village by the river, the baker rose before dawn to light the ovens. " * 12


def _engine(path: str, kv_dtype: KVDtypeChoice, **kw: int) -> MLXEngine:
    return MLXEngine(lambda: load_gguf_model(path, kv_dtype=kv_dtype, native_kernels=native_kernels()), **kw)


def _chat(engine: MLXEngine, text: str) -> list[int]:
    return engine.tokenizer.encode(engine.template.render([{"role": "user", "content": text}]),
                                   add_special_tokens=False)


@pytest.mark.kernels_off
@pytest.mark.parametrize("name", ["smollm2", "gemma"])
def test_float16_kv_keeps_fp32_greedy_text(name: str) -> None:
    path = smollm2_path() if name == "smollm2" else gemma_path()
    texts = {}
    dtypes: tuple[KVDtypeChoice, ...] = ("float32", "float16")
    for dt in dtypes:
        engine = _engine(path, dt, prompt_cache_bytes=0)
        try:
            assert engine.info.kv_dtype == dt
            # ~250 tokens and 12 more: decode rows take the blockwise kernel (from 64 keys)
            ids = (_chat(engine, TEXT + "Who rose before dawn?") if name == "smollm2"
                   else engine.tokenizer.encode(TEXT + "The Eiffel Tower is in the city of"))
            texts[dt] = _run(engine, ids)[0]
        finally:
            engine.close()
    assert texts["float16"] == texts["float32"]


@pytest.mark.kernels_off
def test_float16_streams_batch_as_they_run_alone() -> None:
    engine = _engine(smollm2_path(), "float16", decode_batch=3)
    try:
        qs = ["What is the capital of France?", "Name three colors.", "Write a haiku about the sea. " * 4]
        _check(engine, [_chat(engine, q) for q in qs], 12)
    finally:
        engine.close()


def test_a_prompt_cache_hit_on_float16_kv_matches_the_cold_run() -> None:
    engine = _engine(gemma_path(), "float16", prompt_cache_bytes=64 << 20)
    try:
        base = engine.tokenizer.encode(TEXT)
        cold, _ = _run(engine, base)
        assert _run(engine, base) == (cold, len(base) - 1)
        assert _hits(engine)["exact"] == 1
    finally:
        engine.close()
