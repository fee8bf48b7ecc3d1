"""Model directories (config.json + safetensors) load through mlx-vlm's own loader, text or vision, and
serve like GGUF models: the tiny models' Hugging Face directories against transformers on the same
weights (prompt ids, first-token logits within the GGUF tests' tolerance, 16 greedy tokens), and over real
HTTP: /v1/models, no capacity section for a directory, image chats, the prompt cache, /v1/estimate."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import mlx.core as mx
import numpy as np
import pytest

from gmlx_server.engine.arch import make_cache
from gmlx_server.engine.mlx_engine import MLXEngine
from gmlx_server.engine.model_dir import load_model_dir
from gmlx_server.engine.types import GenerationRequest, SamplingParams, TokenEvent
from tests.e2e.server import LiveServer, gmlx_serve, openai_client
from tests.vision.conftest import FAMILIES, NEW_TOKENS, hf_messages, png, reference
from tests.vision.test_vision_engine import MAX_LOGIT_DIFF, _check, _first_logits, _prompt
from tests.vision.test_vision_http import chat_content, data_uri, image_token
from tests.vision.tiny_models import tiny_text_dir, tiny_vlm

pytestmark = [pytest.mark.slow, pytest.mark.reference]
QUESTION = "What is in this image?"
TEXT = [{"role": "user", "content": "Describe the picture in one word."}]


def _greedy(engine: MLXEngine, ids: list[int], **kw: object) -> list[int]:
    req = GenerationRequest("r", ids, NEW_TOKENS, SamplingParams(temperature=0.0), **kw)  # type: ignore[arg-type]

    async def go() -> list[TokenEvent]:
        return [ev async for ev in engine.submit(req)]

    return [e.token_id for e in asyncio.run(go()) if e.token_id is not None]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_vision_directory_equals_transformers(family: str) -> None:
    hf = tiny_vlm(family).hf_dir
    loaded = load_model_dir(hf)
    assert loaded.info.vision is not None and loaded.info.weights_layout == "mlx"
    expected = reference(family).run(hf_messages(QUESTION), [png(1)])
    ids, slotted, vision = _prompt(loaded.info.vision, loaded.template, loaded.tokenizer, hf_messages(QUESTION),
                                   [png(1)])
    assert ids == expected.ids
    _check(expected, _first_logits(loaded, slotted, vision))
    engine = MLXEngine(lambda: load_model_dir(hf), decode_batch=2)
    try:
        assert _greedy(engine, slotted, vision=vision) == expected.greedy
    finally:
        engine.close()


def test_a_text_directory_equals_transformers() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = tiny_text_dir()
    hf_tok = AutoTokenizer.from_pretrained(d)
    hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    want = hf_tok.apply_chat_template(TEXT, add_generation_prompt=True, tokenize=True, return_dict=False)
    with torch.no_grad():
        logits = hf(torch.tensor([want])).logits[0, -1].numpy()
        greedy = hf.generate(torch.tensor([want]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(want):]
    engine = MLXEngine(lambda: load_model_dir(d), decode_batch=2)
    try:
        ids = engine.tokenizer.encode(engine.template.render(TEXT, add_generation_prompt=True), False)
        assert ids == list(want) and engine.info.vision is None
        assert _greedy(engine, ids) == greedy.tolist()
    finally:
        engine.close()
    loaded = load_model_dir(d)
    got = np.array(loaded.model(mx.array(ids)[None], cache=make_cache(loaded.model)).logits[0, -1])
    assert np.abs(got - logits).max() <= MAX_LOGIT_DIFF


@pytest.fixture(scope="module")
def dir_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    d = tmp_path_factory.mktemp("dir-server")
    config = d / "gmlx.yaml"
    config.write_text(f"server:\n  default_model: gemma-dir\nmodels:\n  gemma-dir:\n"
                      f"    path: {tiny_vlm('gemma3').hf_dir}\n  text-dir:\n    path: {tiny_text_dir()}\n")
    with gmlx_serve(["--config", str(config)], d) as srv:
        yield srv


def test_directories_serve_like_gguf_models(dir_server: LiveServer) -> None:
    rows = {m["id"]: m for m in httpx.get(dir_server.v1 + "/models").json()["data"]}
    assert (rows["gemma-dir"]["vlm"], rows["text-dir"]["vlm"]) == (True, False)
    assert rows["gemma-dir"]["context_length"] == 4096 and rows["gemma-dir"]["max_context_at_width_1"] is None
    assert not httpx.get(dir_server.v1 + "/metrics").json().get("capacity")  # no GGUF header: no capacity table
    # estimate without loading: the text directory's tokenizer and template, read from its files
    est = httpx.post(dir_server.v1 + "/estimate", json={"model": "text-dir", "messages": TEXT}).json()
    hf_len = len(reference_text_ids())
    assert est["prompt_tokens"] == hf_len and est["resident"] is False


def reference_text_ids() -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_text_dir())
    return list(tok.apply_chat_template(TEXT, add_generation_prompt=True, tokenize=True, return_dict=False))


def test_a_directory_takes_images_and_caches_them(dir_server: LiveServer) -> None:
    expected = reference("gemma3").run(hf_messages(QUESTION), [png(1)])
    client = openai_client(dir_server)
    r = client.chat.completions.create(model="gemma-dir", temperature=0, max_tokens=NEW_TOKENS, logprobs=True,
                                       messages=[{"role": "user", "content": chat_content(data_uri(png(1)))}])
    assert [bytes(t.bytes) for t in r.choices[0].logprobs.content] == expected.greedy_bytes
    follow = [{"role": "user", "content": chat_content(data_uri(png(1)))},
              {"role": "assistant", "content": "A picture."}, {"role": "user", "content": "Its colours?"}]
    r = client.chat.completions.create(model="gemma-dir", temperature=0, max_tokens=2, messages=follow)
    slots = [i for i, t in enumerate(expected.ids) if t == image_token("gemma3")]
    assert r.usage.prompt_tokens_details is not None and r.usage.prompt_tokens_details.cached_tokens > slots[-1]


def test_dir_problems_are_named(tmp_path: Path) -> None:
    from gmlx_server.engine.dir_files import dir_problem

    assert "needs config.json" in (dir_problem(str(tmp_path)) or "")
    assert dir_problem(str(tiny_text_dir())) is None
