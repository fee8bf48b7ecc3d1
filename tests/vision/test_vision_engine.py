"""The vision engine against transformers on the same random weights and images, per family.

gmlx loads the text GGUF and the mmproj GGUF that llama.cpp's converter wrote; transformers runs the HF
directory they were converted from. Equal prompt ids (gmlx's template, processor and GGUF tokenizer vs the
HF processor), the first generated token's logits over the whole vocabulary within MAX_LOGIT_DIFF, and the
first 16 greedy tokens equal, through the engine's own prefill and batched decode.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from gmlx_server.engine.arch import make_cache
from gmlx_server.engine.loader import LoadedModel, load_gguf_model
from gmlx_server.engine.mlx_engine import MLXEngine
from gmlx_server.engine.types import GenerationRequest, SamplingParams, TokenEvent
from gmlx_server.engine.vision.prefill import bind_images
from gmlx_server.engine.vision.processor import ImageProcessor
from gmlx_server.engine.vision.prompt import VIRTUAL_BASE, VisionPrompt
from gmlx_server.engine.vision.vision_loader import load_vision_model
from tests.conftest import native_kernels
from tests.vision.conftest import FAMILIES, NEW_TOKENS, Expected, hf_messages, pil, png, reference
from tests.vision.tiny_models import tiny_vlm

pytestmark = [pytest.mark.slow, pytest.mark.reference]
# Largest |logit difference| over the vocabulary (logits span about +-15). Measured on 2 cores (torch 2.13 CPU,
# transformers 5.24, mlx 0.32.4): Gemma 3 6e-5, Idefics3 1.3e-5; fp32 summation order is all that differs.
MAX_LOGIT_DIFF = 1e-3
# The engine's caches follow kv_dtype (auto: float16 where the CPU kernels attend), which rounds each cached key
# and value to 11 bits: Gemma 3's first-token logprobs then move by up to 0.02 (measured) against fp32 caches.
KV_HALF_DIFF = 0.05


def engine_bound(kv_dtype: str) -> float:
    """The bound on the engine's logprobs against transformers' for caches of this dtype."""
    return MAX_LOGIT_DIFF if kv_dtype == "float32" else KV_HALF_DIFF
MULTI = [  # two turns, three images: one in the first turn, two in the second
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this image?"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "A red square."}]},
    {"role": "user", "content": [{"type": "text", "text": "And these two?"}, {"type": "image"}, {"type": "image"}]},
]


def _load(family: str) -> LoadedModel:
    m = tiny_vlm(family)
    return load_vision_model(m.text_gguf, m.mmproj_gguf,
                             functools.partial(load_gguf_model, native_kernels=native_kernels()))


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def loaded(family: str) -> LoadedModel:
    return _load(family)


@pytest.fixture(scope="module")
def engine(family: str) -> Iterator[MLXEngine]:
    eng = MLXEngine(lambda: _load(family), decode_batch=2)
    yield eng
    eng.close()


def _prompt(processor: ImageProcessor, template: Any, tokenizer: Any, messages: Sequence[dict[str, Any]],
            images: Sequence[bytes]) -> tuple[list[int], list[int], VisionPrompt]:
    """(ids as the vocabulary spells them, ids with the images' slots, the images) the way the service builds them."""
    prepared = [processor.prepare(pil(b)) for b in images]
    text = processor.expand(template.render(list(messages), add_generation_prompt=True), prepared)
    ids = tokenizer.encode(text, add_special_tokens=False)
    slotted = list(ids)
    return ids, slotted, processor.bind(slotted, prepared)


def _first_logits(loaded: LoadedModel, slotted: list[int], vision: VisionPrompt) -> np.ndarray:
    binding = bind_images(loaded.model, loaded.vision, GenerationRequest("r", slotted, 1, vision=vision))
    out = binding.model(mx.array(slotted)[None], cache=make_cache(loaded.model)).logits[0, -1]
    return np.array(out.astype(mx.float32))


def _generate(engine: MLXEngine, slotted: list[int], vision: VisionPrompt) -> list[TokenEvent]:
    req = GenerationRequest("r", slotted, NEW_TOKENS, SamplingParams(temperature=0.0), logprobs=True, top_logprobs=20,
                            vision=vision)

    async def go() -> list[TokenEvent]:
        return [ev async for ev in engine.submit(req)]

    events = asyncio.run(go())
    assert events[-1].error is None and events[-1].finish_reason == "length"
    return events


def _check(expected: Expected, got: np.ndarray) -> float:
    n = min(len(got), len(expected.logits))  # transformers' vocabulary may carry rows past the GGUF's tokens
    diff = float(np.abs(got[:n] - expected.logits[:n]).max())
    print(f"max |logit difference| {diff:.2e}")
    assert diff <= MAX_LOGIT_DIFF
    return diff


def _top_logprobs(logits: np.ndarray, k: int) -> np.ndarray:
    lp = logits - logits.max()
    lp = lp - np.log(np.exp(lp).sum())
    return np.sort(lp)[::-1][:k]


@pytest.mark.parametrize("messages, images", [(hf_messages("What is in this image?"), [png(1)]),
                                              (MULTI, [png(1), png(2), png(4, 90, 30)])], ids=["one", "several"])
def test_logits_and_greedy_tokens_equal_transformers(family: str, loaded: LoadedModel, engine: MLXEngine,
                                                     messages: list[dict[str, Any]], images: list[bytes]) -> None:
    expected = reference(family).run(messages, images)
    processor = loaded.info.vision
    assert processor is not None
    ids, slotted, vision = _prompt(processor, loaded.template, loaded.tokenizer, messages, images)
    assert ids == expected.ids  # gmlx's template, processor and GGUF tokenizer agree with transformers' processor
    assert len(vision.images) == len(images) and all(slotted[p] >= VIRTUAL_BASE for i in vision.images
                                                     for p in i.positions)
    _check(expected, _first_logits(loaded, slotted, vision))
    events = _generate(engine, slotted, vision)
    assert [e.token_id for e in events if e.token_id is not None] == expected.greedy
    # the engine's own first-token distribution (its prefill, its sampler's log-softmax), top 20
    got = np.array([lp for _, lp in events[0].top_logprobs])
    assert np.abs(got - _top_logprobs(expected.logits, len(got))).max() <= engine_bound(engine.info.kv_dtype)


def _chunked_rows(loaded: LoadedModel, slotted: list[int], vision: VisionPrompt, chunk: int = 512) -> np.ndarray:
    """Every prompt row's logits, prefilled in RequestRun's chunks (each end moved off an image's interior)."""
    binding = bind_images(loaded.model, loaded.vision, GenerationRequest("r", slotted, 1, vision=vision))
    cache, pos, rows = make_cache(loaded.model), 0, []
    while pos < len(slotted):
        end = binding.chunk_end(pos, min(pos + chunk, len(slotted)))
        rows.append(np.array(binding.model(mx.array(slotted[pos:end])[None], cache=cache).logits[0]))
        pos = end
    return np.concatenate(rows)


def test_an_image_across_the_prefill_chunk_boundary(family: str, loaded: LoadedModel, engine: MLXEngine) -> None:
    """Text long enough that the 512-token prefill chunk boundary falls inside the image: Gemma 3's image
    attends to itself both ways, so gmlx prefills it in one chunk; every row from the image on, and the
    engine's greedy tokens, still equal transformers'."""
    processor = engine.info.vision
    assert processor is not None
    for words in range(200, 600):  # text grows until the image's soft tokens straddle position 512
        text = " ".join(f"w{i % 7}" for i in range(words)) + "\nWhat is in this image?"
        messages = [{"role": "user", "content": [{"type": "text", "text": text}, {"type": "image"}]}]
        ids, slotted, vision = _prompt(processor, engine.template, engine.tokenizer, messages, [png(5)])
        if vision.images[0].start < 512 < vision.images[0].end:
            break
    else:
        pytest.fail("no text length puts the image across the chunk boundary")
    expected = reference(family).run(messages, [png(5)])
    assert ids == expected.ids
    rows = _chunked_rows(loaded, slotted, vision)
    start, n = vision.images[0].start, min(rows.shape[1], expected.rows.shape[1])
    assert np.abs(rows[start:, :n] - expected.rows[start:, :n]).max() <= MAX_LOGIT_DIFF
    events = _generate(engine, slotted, vision)
    assert [e.token_id for e in events if e.token_id is not None] == expected.greedy
    got = np.array([lp for _, lp in events[0].top_logprobs])
    assert np.abs(got - _top_logprobs(expected.logits, len(got))).max() <= engine_bound(engine.info.kv_dtype)
