"""The fetch guard on a real `gmlx serve`: image URLs naming loopback (as a literal in any spelling, or as a DNS
name resolving to it) are refused by default with a 400 `image_fetch_refused` that names the rule and nothing the
target would have said, and the image server sees no request; `image_fetch_allow_private` fetches them; a
redirect from an allowed host to an address that is not allowed is refused. In process, a resolver stub shows the
fetch connects to the address the guard checked, not to whatever the system resolver says later."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest

from gmlx_server.errors import InvalidRequest
from gmlx_server.generation_params import ImageRef
from gmlx_server.serving.fetch_guard import FetchGuard
from gmlx_server.serving.image_fetch import ImagePolicy, image_bytes
from tests.e2e.server import LiveServer, gmlx_serve, openai_client
from tests.vision.conftest import ImageServer, png, write_config
from tests.vision.test_bad_images import chat, openai_error


def loopback_spellings(port: int) -> list[str]:
    return [f"http://{host}:{port}/img/missing.png"
            for host in ("localhost", "127.0.0.1", "2130706433", "0x7f.1", "0177.0.0.1", "[::ffff:127.0.0.1]",
                         "[::1]", "LOCALHOST.")]


@pytest.fixture(scope="module")
def guarded_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    d = tmp_path_factory.mktemp("guarded")
    with gmlx_serve(["--config", str(write_config(d / "gmlx.yaml", allowed="[]"))], d) as srv:
        yield srv


@pytest.fixture(scope="module")
def private_ok_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    d = tmp_path_factory.mktemp("private-ok")
    cfg = write_config(d / "gmlx.yaml", allowed="[]", image_fetch_allow_private="true")
    with gmlx_serve(["--config", str(cfg)], d) as srv:
        yield srv


@pytest.mark.slow
def test_loopback_is_refused_by_default(guarded_server: LiveServer, image_server: ImageServer) -> None:
    before = len(image_server.hits)
    for url in loopback_spellings(image_server.port):
        err = openai_error(chat(guarded_server, url), "image_fetch_refused")
        assert "loopback" in err["message"] and "server.image_fetch_allow_private" in err["message"]
        assert "404" not in err["message"] and "text/plain" not in err["message"], err  # nothing of the target
    assert len(image_server.hits) == before  # not one request reached it
    assert "refused by the fetch guard (its host is a loopback address)" in guarded_server.log()


@pytest.mark.slow
def test_metadata_address_is_refused_through_the_sdk(guarded_server: LiveServer) -> None:
    content = [{"type": "text", "text": "hi"},
               {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data/"}}]
    with pytest.raises(openai.BadRequestError) as e:
        openai_client(guarded_server).chat.completions.create(
            model="gemma-vlm", max_tokens=2, messages=[{"role": "user", "content": content}])  # type: ignore[misc]
    assert e.value.code == "image_fetch_refused" and "link-local address" in e.value.message


@pytest.mark.slow
def test_allow_private_fetches_loopback(private_ok_server: LiveServer, image_server: ImageServer) -> None:
    r = chat(private_ok_server, f"http://127.0.0.1:{image_server.port}/img/a.png")
    assert r.status_code == 200, r.text


@pytest.mark.slow
def test_a_redirect_to_a_private_address_is_refused(vlm_server: LiveServer, image_server: ImageServer) -> None:
    assert chat(vlm_server, image_server.url("/img/a.png")).status_code == 200  # localhost is allowed by name
    err = openai_error(chat(vlm_server, image_server.url("/redirect-to-loopback-ip")), "image_fetch_refused")
    assert "a redirect led to a loopback address" in err["message"]


def fetch(guard: FetchGuard, url: str) -> tuple[bytes, str]:
    return asyncio.run(image_bytes(ImageRef("p", url=url), ImagePolicy(guard=guard)))


def test_the_fetch_connects_to_the_checked_address(image_server: ImageServer) -> None:
    async def resolve(host: str, port: int) -> list[str]:
        return {"images.internal": ["127.0.0.1"], "rebound.example": ["127.0.0.1"]}[host]

    # images.internal exists only in the stub: a fetch that asked the system resolver again could not connect
    allowed = FetchGuard.of(False, ["images.internal"], resolve)
    url = f"http://images.internal:{image_server.port}/img/a.png"
    assert fetch(allowed, url) == (png(1), "image/png")
    assert image_server.hits[-1] == "/img/a.png"
    with pytest.raises(InvalidRequest, match="its host is a loopback address") as e:
        fetch(FetchGuard.of(False, [], resolve), f"http://rebound.example:{image_server.port}/img/a.png")
    assert e.value.code == "image_fetch_refused"
