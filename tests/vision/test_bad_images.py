"""Bad images get typed 400s naming the part, never a 500, on a real `gmlx serve`: an image for a text-only
model, undecodable bytes, a type gmlx does not read, an image over the size limit, and every fetch limit
(a server that never finishes, a huge body declared or streamed, a redirect to file://, a page that is not
an image). The slow URL trickles for a minute and the client waits 30 s, so only the server's own deadline
(1 s here) can answer it. With `image_fetch: false` URLs are refused and data URIs still work.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.server import LiveServer, gmlx_serve
from tests.vision.conftest import FETCH_TIMEOUT_S, MAX_IMAGE_BYTES, ImageServer, png, write_config

pytestmark = pytest.mark.slow
CLIENT_TIMEOUT_S = 30.0  # far past the server's fetch deadline: a hang shows as this client's timeout


def uri(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64," + base64.b64encode(data).decode()


def chat(server: LiveServer, url: str, model: str = "gemma-vlm") -> httpx.Response:
    content = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]
    return httpx.post(server.v1 + "/chat/completions", timeout=CLIENT_TIMEOUT_S, json={
        "model": model, "max_tokens": 2, "messages": [{"role": "user", "content": content}]})


def openai_error(r: httpx.Response, code: str) -> dict[str, Any]:
    assert r.status_code == 400, r.text
    err: dict[str, Any] = r.json()["error"]
    assert err["code"] == code and err["param"] == "messages[0].content[1]", err
    assert err["message"].startswith("'messages[0].content[1]'") and "Traceback" not in r.text
    return err


def tiff() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(out, "TIFF")
    return out.getvalue()


def test_an_image_for_a_text_only_model(vlm_server: LiveServer) -> None:
    r = chat(vlm_server, uri(png(1)), model="smollm2")
    assert r.status_code == 400 and r.json()["error"]["type"] == "unsupported_feature"
    assert r.json()["error"]["param"] == "messages[0].content[1]" and "not a vision model" in r.text


@pytest.mark.parametrize("url, code, words", [
    (uri(b"\x89PNG\r\n\x1a\n not really a png"), "invalid_image_data", "not a decodable image"),
    (uri(tiff(), "image/tiff"), "unsupported_image_type", "image/tiff"),
    (uri(tiff()), "unsupported_image_type", "TIFF"),  # declared png, the bytes say otherwise
    (uri(png(3, 400, 400)), "image_too_large", f"limit of {MAX_IMAGE_BYTES} bytes"),
])
def test_bad_inline_images(vlm_server: LiveServer, url: str, code: str, words: str) -> None:
    assert words in openai_error(chat(vlm_server, url), code)["message"]


@pytest.mark.parametrize("path, code, words", [
    ("/slow", "image_fetch_failed", f"took longer than {FETCH_TIMEOUT_S:g} s"),
    ("/huge-declared", "image_too_large", "Content-Length"),
    ("/huge-streamed", "image_too_large", f"more than {MAX_IMAGE_BYTES} bytes"),
    ("/redirect-to-file", "image_fetch_failed", "redirected to file:///etc/passwd"),
    ("/page", "unsupported_image_type", "is text/html"),
    ("/img/missing.png", "image_fetch_failed", "HTTP 404"),
    ("/img/big.png", "image_too_large", "over the limit"),
])
def test_fetch_limits(vlm_server: LiveServer, image_server: ImageServer, path: str, code: str, words: str) -> None:
    url = image_server.url(path)
    err = openai_error(chat(vlm_server, url), code)
    assert words in err["message"] and url in err["message"]
    assert f"image fetch {url}: " in vlm_server.log()  # every fetch is logged, failed ones too


def test_other_schemes_and_anthropic_shape(vlm_server: LiveServer) -> None:
    err = chat(vlm_server, "file:///etc/passwd").json()["error"]
    assert err["code"] == "invalid_image_url" and err["param"] == "messages[0].content[1].image_url.url"
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "Qk0="}}
    r = httpx.post(vlm_server.base_url + "/v1/messages", timeout=CLIENT_TIMEOUT_S, json={
        "model": "gemma-vlm", "max_tokens": 2, "messages": [{"role": "user", "content": [block]}]})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error" and "'messages[0].content[0]'" in r.text
    assert "image/bmp" in r.json()["error"]["message"]
    assert chat(vlm_server, uri(png(1))).status_code == 200  # the server is fine after all of it


@pytest.fixture(scope="module")
def no_fetch_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    d = tmp_path_factory.mktemp("no-fetch")
    with gmlx_serve(["--config", str(write_config(d / "gmlx.yaml", image_fetch="false"))], d) as srv:
        yield srv


def test_fetching_can_be_turned_off(no_fetch_server: LiveServer, image_server: ImageServer) -> None:
    url = image_server.url("/img/a.png")
    err = openai_error(chat(no_fetch_server, url), "image_fetch_disabled")
    assert "server.image_fetch: false" in err["message"] and url in err["message"]
    assert chat(no_fetch_server, uri(png(1))).status_code == 200
