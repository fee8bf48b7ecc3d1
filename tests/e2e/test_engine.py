"""The engine on the real models: answers, the thread interface, sampling controls, logprobs, errors."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from gmlx_plan.gguf_header import GGUFFormatError
from gmlx_server.engine.arch import UnsupportedArchitecture
from gmlx_server.engine.loader import LoadedModel, load_gguf_model
from gmlx_server.engine.mlx_engine import MLXEngine
from gmlx_server.engine.types import GenerationRequest, SamplingParams, TokenEvent
from tests.conftest import gemma_path, native_kernels, smollm2_path
from tests.gguf_factory import FakeTensor, write_gguf

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def smol() -> Iterator[MLXEngine]:
    engine = MLXEngine(lambda: load_gguf_model(smollm2_path(), "smollm2", native_kernels=native_kernels()))
    yield engine
    engine.close()


def _chat(engine: MLXEngine, text: str) -> list[int]:
    rendered = engine.template.render([{"role": "user", "content": text}], add_generation_prompt=True)
    return engine.tokenizer.encode(rendered, add_special_tokens=False)


def _collect(engine: MLXEngine, req: GenerationRequest) -> list[TokenEvent]:
    async def go() -> list[TokenEvent]:
        return [ev async for ev in engine.submit(req)]

    return asyncio.run(go())


def _text(events: list[TokenEvent]) -> str:
    return "".join(e.text for e in events)


@pytest.mark.kernels_off
def test_smollm2_answers_paris_through_the_engine_thread(smol: MLXEngine) -> None:
    events = _collect(smol, GenerationRequest("r1", _chat(smol, "What is the capital of France?"), 32, GREEDY))
    assert "Paris" in _text(events)
    final = events[-1]
    assert final.finish_reason == "stop" and final.timings is not None
    assert final.timings.generated == len([e for e in events if e.token_id is not None])


@pytest.mark.kernels_off
def test_gemma_base_continues_eiffel_tower_with_paris() -> None:
    engine = MLXEngine(lambda: load_gguf_model(gemma_path(), "gemma", native_kernels=native_kernels()))
    try:
        assert engine.template.source.startswith("family:")  # the base model ships no template
        ids = engine.tokenizer.encode("The Eiffel Tower is in the city of")
        assert ids[0] == engine.tokenizer.bos_id
        events = _collect(engine, GenerationRequest("g1", ids, 8, GREEDY))
        assert _text(events).startswith(" Paris")
        assert events[-1].finish_reason == "length"
    finally:
        engine.close()


@pytest.mark.kernels_off
def test_packed_and_dense_layouts_agree_greedily() -> None:
    dense = load_gguf_model(smollm2_path(), layout="dense", native_kernels=native_kernels())
    packed = load_gguf_model(smollm2_path(), layout="packed", native_kernels=native_kernels())
    assert (dense.info.weights_layout, packed.info.weights_layout) == ("dense", "packed")
    ids = dense.tokenizer.encode("The capital of France is")
    assert _greedy(dense, ids, 8) == _greedy(packed, ids, 8)


def _greedy(m: LoadedModel, ids: list[int], n: int) -> list[int]:
    cache = m.model.make_cache()
    logits = m.model(mx.array([ids]), cache=cache).logits[:, -1, :]
    out = []
    for _ in range(n):
        tok = int(mx.argmax(logits, -1).item())
        out.append(tok)
        logits = m.model(mx.array([[tok]]), cache=cache).logits[:, -1, :]
    return out


def test_seed_reproduces_a_sampled_answer(smol: MLXEngine) -> None:
    ids = _chat(smol, "Write one sentence about the sea.")
    p = SamplingParams(temperature=1.0, top_p=0.95, min_p=0.05, seed=1234)
    a = _text(_collect(smol, GenerationRequest("s1", ids, 24, p)))
    b = _text(_collect(smol, GenerationRequest("s2", ids, 24, p)))
    others = {_text(_collect(smol, GenerationRequest(f"s{i}", ids, 24, SamplingParams(1.0, seed=i))))
              for i in range(3, 6)}
    assert a == b
    assert len(others | {a}) > 1  # different seeds do not all collapse to one text


def test_stop_string_and_max_tokens(smol: MLXEngine) -> None:
    ids = _chat(smol, "What is the capital of France?")
    events = _collect(smol, GenerationRequest("st", ids, 32, GREEDY, stop=("Paris",)))
    assert events[-1].finish_reason == "stop" and events[-1].stop_string == "Paris"
    assert "Paris" not in _text(events)
    events = _collect(smol, GenerationRequest("mx", ids, 3, GREEDY))
    assert events[-1].finish_reason == "length" and events[-1].timings.generated == 3  # type: ignore[union-attr]


def test_logit_bias_bans_a_token(smol: MLXEngine) -> None:
    ids = _chat(smol, "What is the capital of France?")
    first = _collect(smol, GenerationRequest("b0", ids, 1, GREEDY))[0].token_id
    assert first is not None
    banned = SamplingParams(temperature=0.0, logit_bias={first: -100.0})
    assert _collect(smol, GenerationRequest("b1", ids, 1, banned))[0].token_id != first


@pytest.mark.kernels_off
def test_logprobs_sum_to_the_sequence_logprob_and_tops_are_sorted(smol: MLXEngine) -> None:
    ids = _chat(smol, "Name a color.")
    events = _collect(smol, GenerationRequest("lp", ids, 6, GREEDY, logprobs=True, top_logprobs=3))
    toks = [e.token_id for e in events if e.token_id is not None]
    lps = [e.logprob for e in events if e.token_id is not None]
    for e in events:
        if e.token_id is not None:
            vals = [v for _, v in e.top_logprobs]
            assert len(vals) == 3 and vals == sorted(vals, reverse=True)
            assert e.top_logprobs[0][0] == e.token_id  # greedy picks the top alternative
    ref = _sequence_logprob(ids, toks)  # type: ignore[arg-type]
    assert math.isclose(sum(lps), ref, abs_tol=1e-2)  # type: ignore[arg-type]


def _sequence_logprob(prompt: list[int], gen: list[int]) -> float:
    """Teacher-forced reference on a separate load of the same weights, in one forward pass."""
    loaded = load_gguf_model(smollm2_path(), native_kernels=native_kernels())
    logits = loaded.model(mx.array([prompt + gen])).logits[0].astype(mx.float32)
    lsm = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    rows = mx.arange(len(prompt) - 1, len(prompt) + len(gen) - 1)
    return float(mx.sum(lsm[rows, mx.array(gen)]).item())


def test_cancel_ends_a_request_with_cancelled(smol: MLXEngine) -> None:
    async def go() -> list[TokenEvent]:
        handle = smol.submit(GenerationRequest("c1", _chat(smol, "Count to one hundred."), 200, GREEDY))
        seen = []
        async for ev in handle:
            seen.append(ev)
            if len(seen) == 2:
                handle.cancel()
        return seen

    events = asyncio.run(go())
    assert events[-1].finish_reason == "cancelled" and len(events) < 20


def test_bad_files_fail_with_the_file_and_the_reason(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all, just some bytes" * 4)
    with pytest.raises(GGUFFormatError, match=r"junk.gguf.*not a GGUF file"):
        load_gguf_model(junk)
    real = Path(smollm2_path()).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(real[: len(real) // 2])
    with pytest.raises(GGUFFormatError, match=r"cut.gguf.*truncated"):
        load_gguf_model(cut)
    odd = tmp_path / "odd.gguf"
    write_gguf(odd, [FakeTensor("token_embd.weight", np.zeros((8, 32), np.float32), GGMLQuantizationType.F32)],
               arch="mamba")
    with pytest.raises(UnsupportedArchitecture, match=r"odd.gguf.*'mamba'"):
        load_gguf_model(odd)
