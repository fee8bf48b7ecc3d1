"""Vision over real HTTP on a real `gmlx serve`, with the official SDKs, against transformers' reference.

Per family: the OpenAI SDK with the image as a data URI and as a URL on a loopback HTTP server (the first
token's top-20 logprobs within the engine test's tolerance of transformers' log-softmax, the 16 greedy
tokens' bytes equal), the Anthropic SDK (base64 and url image blocks) and Responses (input_image) giving the
same text; several images across turns; a follow-up about the same image reuses the cached prefix, a
different image does not; count_tokens and /v1/estimate count the image tokens; /v1/models marks vlm.
"""

from __future__ import annotations

import base64
from typing import Any

import httpx
import numpy as np
import pytest

from tests.e2e.server import LiveServer, anthropic_client, openai_client
from tests.vision.conftest import FAMILIES, MODEL_IDS, NEW_TOKENS, ImageServer, hf_messages, png, reference
from tests.vision.test_vision_engine import _top_logprobs, engine_bound

pytestmark = [pytest.mark.slow, pytest.mark.reference]
QUESTION = "What is in this image?"
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": NEW_TOKENS}


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def chat_content(url: str, question: str = QUESTION) -> list[dict[str, Any]]:
    return [{"type": "image_url", "image_url": {"url": url, "detail": "auto"}}, {"type": "text", "text": question}]


@pytest.fixture(params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_models_mark_vision(vlm_server: LiveServer) -> None:
    rows = {m["id"]: m for m in httpx.get(vlm_server.v1 + "/models").json()["data"]}
    assert rows["gemma-vlm"]["vlm"] and rows["idefics-vlm"]["vlm"] and rows["smollm2"]["vlm"] is False


def test_openai_data_uri_and_url_equal_transformers(family: str, vlm_server: LiveServer,
                                                    image_server: ImageServer) -> None:
    expected = reference(family).run(hf_messages(QUESTION), [png(1)])
    client = openai_client(vlm_server)
    for url in (data_uri(png(1)), image_server.url("/img/a.png"), image_server.url("/redirect-to-image")):
        r = client.chat.completions.create(model=MODEL_IDS[family], messages=[
            {"role": "user", "content": chat_content(url)}], logprobs=True, top_logprobs=20, **GREEDY)
        tokens = r.choices[0].logprobs.content
        assert [bytes(t.bytes) for t in tokens] == expected.greedy_bytes
        got = np.array([t.logprob for t in tokens[0].top_logprobs])
        resident = {m["id"]: m for m in httpx.get(vlm_server.v1 + "/models").json()["data"]}[MODEL_IDS[family]]
        bound = engine_bound(resident["kv_dtype"])  # the caches it built (resident now)
        assert len(got) == 20 and np.abs(got - _top_logprobs(expected.logits, 20)).max() <= bound
        assert r.usage.prompt_tokens == len(expected.ids)  # the image's soft tokens count as prompt tokens
    fetched = (f"image fetch {image_server.url('/redirect-to-image')}: {len(png(1))} bytes of image/png "
               f"(from {image_server.url('/img/a.png')}) in ")
    assert fetched in vlm_server.log()


def test_anthropic_blocks_and_responses_give_the_same_text(family: str, vlm_server: LiveServer,
                                                           image_server: ImageServer) -> None:
    expected = reference(family).run(hf_messages(QUESTION), [png(1)])
    b64 = base64.b64encode(png(1)).decode()
    anthropic = anthropic_client(vlm_server)
    for source in ({"type": "base64", "media_type": "image/png", "data": b64},
                   {"type": "url", "url": image_server.url("/img/a.png")}):
        content = [{"type": "image", "source": source}, {"type": "text", "text": QUESTION}]
        msg = anthropic.messages.create(model=MODEL_IDS[family], max_tokens=NEW_TOKENS,
                                        messages=[{"role": "user", "content": content}], extra_body={"temperature": 0})
        usage = msg.usage  # Anthropic counts the tokens read from the prompt cache apart
        assert msg.content[0].text == expected.text
        assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == len(expected.ids)
    r = openai_client(vlm_server).responses.create(
        model=MODEL_IDS[family], max_output_tokens=NEW_TOKENS, temperature=0, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": data_uri(png(1))}, {"type": "input_text", "text": QUESTION}]}])
    assert r.output_text == expected.text and r.usage.input_tokens == len(expected.ids)


def test_several_images_across_turns(family: str, vlm_server: LiveServer) -> None:
    hf = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]},
          {"role": "assistant", "content": [{"type": "text", "text": "A red square."}]},
          {"role": "user", "content": [{"type": "text", "text": "And these two?"}, {"type": "image"},
                                       {"type": "image"}]}]
    images = [png(1), png(2), png(4, 90, 30)]
    expected = reference(family).run(hf, images)
    messages = [{"role": "user", "content": chat_content(data_uri(images[0]))},
                {"role": "assistant", "content": "A red square."},
                {"role": "user", "content": [{"type": "text", "text": "And these two?"},
                                             *chat_content(data_uri(images[1]))[:1],
                                             *chat_content(data_uri(images[2]))[:1]]}]
    r = openai_client(vlm_server).chat.completions.create(model=MODEL_IDS[family], messages=messages,
                                                          logprobs=True, **GREEDY)
    assert [bytes(t.bytes) for t in r.choices[0].logprobs.content] == expected.greedy_bytes
    assert r.usage.prompt_tokens == len(expected.ids)


def test_a_follow_up_about_the_same_image_reuses_the_cache(family: str, vlm_server: LiveServer) -> None:
    client = openai_client(vlm_server)
    model = MODEL_IDS[family]
    httpx.post(vlm_server.v1 + "/cache/reset", json={"model": model}).raise_for_status()

    def ask(image: bytes, follow_up: bool) -> tuple[int, int]:
        messages: list[dict[str, Any]] = [{"role": "user", "content": chat_content(data_uri(image))}]
        if follow_up:
            messages += [{"role": "assistant", "content": "A picture."},
                         {"role": "user", "content": "Describe its colours."}]
        r = client.chat.completions.create(model=model, messages=messages, **GREEDY)
        details = r.usage.prompt_tokens_details
        return r.usage.prompt_tokens, details.cached_tokens if details else 0

    ids = reference(family).run(hf_messages(QUESTION), [png(1)]).ids
    slots = [i for i, t in enumerate(ids) if t == image_token(family)]
    assert ask(png(1), False) == (len(ids), 0)
    _, cached = ask(png(1), True)  # the same image: the first prompt's prefix, its image included, is reused
    assert cached > slots[-1]
    _, cached = ask(png(2), True)  # another image: the prefix diverges at its first soft token
    assert cached <= slots[0]


def image_token(family: str) -> int:
    processor = reference(family).processor
    return int(processor.tokenizer.convert_tokens_to_ids("<image_soft_token>" if family == "gemma3" else "<image>"))


def test_count_tokens_and_estimate_count_the_image(family: str, vlm_server: LiveServer,
                                                   image_server: ImageServer) -> None:
    n = len(reference(family).run(hf_messages(QUESTION), [png(1)]).ids)
    model = MODEL_IDS[family]
    image = {"type": "image", "source": {"type": "url", "url": image_server.url("/img/a.png")}}
    counted = anthropic_client(vlm_server).messages.count_tokens(model=model, messages=[
        {"role": "user", "content": [image, {"type": "text", "text": QUESTION}]}])
    assert counted.input_tokens == n
    est = httpx.post(vlm_server.v1 + "/estimate", json={"model": model, "max_tokens": 4, "messages": [
        {"role": "user", "content": chat_content(data_uri(png(1)))}]}, timeout=60).json()
    assert est["prompt_tokens"] == n and est["context_ok"] is True
