"""Fast checks of the vision pieces: the protocols' image parts, the prompt's image slots and chunking, the
projector refusals, and image decoding and its limits (no model, no torch)."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from gmlx_server.engine.types import GenerationRequest
from gmlx_server.engine.vision.mmproj import UnsupportedProjector, check_pair, read_projector
from gmlx_server.engine.vision.prefill import VisionRuntime, bind_images
from gmlx_server.engine.vision.prompt import VIRTUAL_BASE, ImageSlots, VisionPrompt, real_ids, virtual_ids
from gmlx_server.engine.vision.vision_loader import load_vision_model
from gmlx_server.errors import InvalidRequest, UnsupportedFeature
from gmlx_server.generation_params import ImageRef
from gmlx_server.protocol.anthropic import parse_messages
from gmlx_server.protocol.image_parts import join_content
from gmlx_server.protocol.openai import parse_chat
from gmlx_server.protocol.responses import parse_responses
from gmlx_server.serving.image_fetch import ImagePolicy, decode, image_bytes
from tests.gguf_factory import FakeTensor, write_gguf
from tests.vision.conftest import png

B64 = base64.b64encode(b"\x89PNG-bytes").decode()


def _image(content: object) -> ImageRef:
    assert isinstance(content, list)
    (ref,) = [p["image"] for p in content if p["type"] == "image"]
    assert isinstance(ref, ImageRef)
    return ref


def test_openai_image_url_parts() -> None:
    msg = {"role": "user", "content": [{"type": "text", "text": "a"},
                                       {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{B64}",
                                                                           "detail": "low"}}]}
    params = parse_chat({"messages": [msg]})
    ref = _image(params.messages[0]["content"])
    assert (ref.param, ref.data, ref.media_type, ref.detail) == ("messages[0].content[1]", b"\x89PNG-bytes",
                                                                 "image/png", "low")
    url = parse_chat({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": "https://x.test/a.png"}]}]}).messages[0]["content"]
    assert _image(url).url == "https://x.test/a.png"
    assert parse_chat({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}).messages[0][
        "content"] == "a"  # text alone stays a string


@pytest.mark.parametrize("part, param", [
    ({"type": "image_url", "image_url": {"url": "ftp://x/a.png"}}, "messages[0].content[0].image_url.url"),
    ({"type": "image_url", "image_url": {"url": "data:image/png,raw"}}, "messages[0].content[0].image_url.url"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}, "messages[0].content[0].image_url.url"),
    ({"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "max"}},
     "messages[0].content[0].image_url.detail"),
    ({"type": "image_url", "image_url": 5}, "messages[0].content[0].image_url"),
])
def test_bad_image_parts_name_their_field(part: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_chat({"messages": [{"role": "user", "content": [part]}]})
    assert e.value.param == param


def test_images_only_in_user_turns() -> None:
    part = {"type": "image_url", "image_url": {"url": "https://x/a.png"}}
    with pytest.raises(UnsupportedFeature, match="user messages only"):
        parse_chat({"messages": [{"role": "system", "content": [part]}]})


def test_anthropic_and_responses_images() -> None:
    blocks = [{"type": "text", "text": "q"}, {"type": "image", "source": {"type": "base64", "media_type": "IMAGE/PNG",
                                                                           "data": B64}},
              {"type": "image", "source": {"type": "url", "url": "https://x/b.png"}}]
    content = parse_messages({"max_tokens": 4, "messages": [{"role": "user", "content": blocks}]}).messages[0][
        "content"]
    assert [p["type"] for p in content] == ["text", "image", "image"]
    assert (content[1]["image"].param, content[1]["image"].media_type) == ("messages[0].content[1]", "image/png")
    assert content[2]["image"].url == "https://x/b.png"
    with pytest.raises(InvalidRequest) as e:
        parse_messages({"max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "file", "file_id": "f"}}]}]})
    assert e.value.param == "messages[0].content[0].source.type"
    items = [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/c.png", "detail": "high"},
                                          {"type": "input_text", "text": "q"}]}]
    ref = _image(parse_responses({"input": items}).params.messages[0]["content"])
    assert (ref.param, ref.url, ref.detail) == ("input[0].content[0]", "https://x/c.png", "high")


def test_turns_with_images_merge_as_parts() -> None:
    img = {"type": "image", "image": ImageRef("p", url="https://x")}
    assert join_content("a", [img]) == [{"type": "text", "text": "a"}, img]
    assert join_content("a", "b") == "a\nb"


def test_virtual_ids_key_on_content() -> None:
    a, b = virtual_ids(b"digest-a", 256), virtual_ids(b"digest-b", 256)
    assert a == virtual_ids(b"digest-a", 256) and len(set(a)) == 256 and not set(a) & set(b)
    assert min(a + b) >= VIRTUAL_BASE and max(a + b) < 2**31  # the engine's int32 prompt holds them
    assert real_ids([1, a[0], 2], 99) == [1, 99, 2]


def _vision(spans: list[tuple[int, int]], bidirectional: bool) -> VisionPrompt:
    pixels = np.zeros((1, 3, 2, 2), np.float32)
    return VisionPrompt(tuple(ImageSlots(b"d", pixels, None, tuple(range(s, e))) for s, e in spans), 7, bidirectional)


def test_chunks_never_end_inside_an_image_that_prefills_whole() -> None:
    prompt = list(range(40))
    prompt[10:20], prompt[30:34] = virtual_ids(b"x", 10), virtual_ids(b"y", 4)
    req = GenerationRequest("r", prompt, 1, vision=_vision([(10, 20), (30, 34)], bidirectional=True))
    tower = cast(VisionRuntime, object())  # chunk_end reads only the prompt's spans
    b = bind_images(object(), tower, req)
    assert b.token_ids[10:20] == [7] * 10 and b.token_ids[:10] == list(range(10))  # the sampler's history
    assert [b.chunk_end(0, 15), b.chunk_end(10, 15), b.chunk_end(0, 8), b.chunk_end(20, 32)] == [10, 20, 8, 30]
    causal = bind_images(object(), tower, GenerationRequest("r", [1] * 40, 1, vision=_vision([(10, 20)], False)))
    assert causal.chunk_end(0, 15) == 15  # causal images may be cut anywhere
    with pytest.raises(ValueError, match="no vision tower"):
        bind_images(object(), None, req)


def _clip(path: Path, **meta: object) -> Path:
    base: dict[str, object] = {"clip.has_vision_encoder": True, "clip.projector_type": "gemma3"}
    return write_gguf(path, [FakeTensor("v.post_ln.weight", np.ones(4, np.float32), 0)], arch="clip",
                      metadata={**base, **meta})


def test_projectors_gmlx_cannot_run_are_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedProjector, match="projector type 'llava' is not supported"):
        read_projector(_clip(tmp_path / "a.gguf", **{"clip.projector_type": "llava"}))
    with pytest.raises(UnsupportedProjector, match=r"clip\.vision\.image_size is missing"):
        read_projector(_clip(tmp_path / "b.gguf"))
    text = write_gguf(tmp_path / "t.gguf", [FakeTensor("x.weight", np.ones(4, np.float32), 0)], arch="llama")
    with pytest.raises(UnsupportedProjector, match="not a vision projector"):
        read_projector(text)
    # the refusal comes before any text weights load: this text path does not even exist
    with pytest.raises(UnsupportedProjector, match="'llava'"):
        load_vision_model(tmp_path / "missing.gguf", _clip(tmp_path / "a.gguf", **{"clip.projector_type": "llava"}))


def test_a_projector_must_fit_its_text_model(tmp_path: Path) -> None:
    meta = {f"clip.vision.{k}": v for k, v in {"image_size": 32, "patch_size": 8, "embedding_length": 32,
                                               "feed_forward_length": 64, "block_count": 1,
                                               "attention.head_count": 2, "projection_dim": 64}.items()}
    p = read_projector(_clip(tmp_path / "p.gguf", **meta))
    assert (p.family, p.tokens_per_tile) == ("gemma3", 1)  # 4x4 patches pooled by the default factor 4
    from gmlx_plan.gguf_header import read_header

    llama = read_header(write_gguf(tmp_path / "l.gguf", [FakeTensor("x.weight", np.ones(4, np.float32), 0)],
                                   metadata={"llama.embedding_length": 64}))
    with pytest.raises(UnsupportedProjector, match="needs a gemma3 text model"):
        check_pair(p, llama)
    gemma = read_header(write_gguf(tmp_path / "g.gguf", [FakeTensor("x.weight", np.ones(4, np.float32), 0)],
                                   arch="gemma3", metadata={"gemma3.embedding_length": 48}))
    with pytest.raises(UnsupportedProjector, match="projects to 64 dimensions"):
        check_pair(p, gemma)


def test_decoding_and_inline_limits() -> None:
    ref = ImageRef("messages[0].content[0]", data=png(1))
    assert decode(ref, png(1), "image/png").size == (56, 40)
    assert decode(ref, png(1, fmt="JPEG"), None).mode == "RGB"
    for data, media, code in ((b"nope", "image/png", "invalid_image_data"), (png(1), "image/svg+xml",
                                                                              "unsupported_image_type"),
                              (png(1, fmt="BMP"), None, "unsupported_image_type")):
        with pytest.raises(InvalidRequest) as e:
            decode(ref, data, media)
        assert (e.value.code, e.value.param) == (code, "messages[0].content[0]")
    with pytest.raises(InvalidRequest) as e:
        asyncio.run(image_bytes(ref, ImagePolicy(max_bytes=100)))
    assert e.value.code == "image_too_large"
    with pytest.raises(InvalidRequest) as e:
        asyncio.run(image_bytes(ImageRef("p", url="http://127.0.0.1:9/a.png"), ImagePolicy(fetch=False)))
    assert e.value.code == "image_fetch_disabled"


@pytest.mark.parametrize("extra, key", [("mmproj: {mmproj}", "mmproj"), ("kv_quant: {{scheme: uniform, bits: 8}}",
                                                                          "kv_quant"), ("weights: dense", "weights")])
def test_a_model_directory_refuses_gguf_options(tmp_path: Path, extra: str, key: str) -> None:
    from gmlx_server.config import ConfigError
    from gmlx_server.config.parse import parse

    mmproj = _clip(tmp_path / "p.gguf")
    (tmp_path / "model").mkdir()
    text = f"models:\n  m:\n    path: {tmp_path / 'model'}\n    " + extra.format(mmproj=mmproj) + "\n"
    with pytest.raises(ConfigError) as e:
        parse(str(tmp_path / "gmlx.yaml"), text)
    assert e.value.key == f"models.m.{key}" and "model directory" in e.value.what


def test_the_projector_counts_in_the_load_gates_weights(tmp_path: Path) -> None:
    from dataclasses import replace

    from gmlx_server.config import ModelEntry
    from gmlx_server.engine.vision.mmproj import tower_bytes
    from gmlx_server.serving.capacity import memory_model
    from tests.conftest import smollm2_path

    text = ModelEntry(id="m", path=smollm2_path())
    mmproj = _clip(tmp_path / "p.gguf")
    with_tower = memory_model(replace(text, mmproj=str(mmproj)))
    assert with_tower.weights_bytes == memory_model(text).weights_bytes + tower_bytes(mmproj) > 0
    assert tower_bytes(mmproj, on_gpu=False) == 4 * 4 and tower_bytes(mmproj, on_gpu=True) == 2 * 4
