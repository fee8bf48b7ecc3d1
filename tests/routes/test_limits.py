"""Limits on what a client can hold or make the server echo: body read timeout, clipped error echoes."""

from __future__ import annotations

import asyncio
from typing import Any

from gmlx_server.config import RuntimeEnv
from gmlx_server.errors import MAX_MESSAGE_CHARS, GmlxError, clip
from tests.routes.conftest import make_config, serve


def test_a_stalled_body_gets_a_typed_408_and_the_server_keeps_serving() -> None:
    s = serve(make_config(env=RuntimeEnv(body_timeout_s=0.2)))

    async def stalls() -> Any:  # half a body, then nothing, as a client that stopped sending
        yield b'{"model": "m1", "messages": [{"role": "user", '
        await asyncio.sleep(3600)

    for path in ("/v1/chat/completions", "/v1/messages"):
        r = s.client.post(path, content=stalls(), headers={"Content-Type": "application/json"})
        assert r.status_code == 408 and r.headers["connection"] == "close", r.text
        err = r.json()["error"]
        assert err["code" if path == "/v1/messages" else "type"] == "request_timeout"
        assert "GMLX_BODY_TIMEOUT_S" in err["message"]
    assert s.chat().status_code == 200
    s.client.close()


def test_a_huge_model_name_is_not_echoed_whole() -> None:
    s = serve()
    name = "x" * 5_000_000
    r = s.chat({"model": name})
    err = r.json()["error"]
    assert r.status_code == 404 and err["type"] == "model_not_found"
    assert len(err["message"]) < 400 and "(5000000 chars)" in err["message"]
    r = s.chat({"model": "m1@" + "p" * 10_000})  # the id and the profile, each clipped
    assert r.status_code == 404 and len(r.json()["error"]["message"]) < 700
    r = s.chat({"model": "m1", "profile": "p" * 10_000})
    assert r.status_code == 400 and len(r.json()["error"]["message"]) < 400
    r = s.client.post("/v1/keep", json={"model": "y" * 100_000})
    assert r.status_code == 404 and len(r.json()["error"]["message"]) < 400
    s.client.close()


def test_every_error_message_is_bounded() -> None:
    assert clip("abc") == "abc" and clip("a" * 201) == "a" * 200 + "… (201 chars)"
    err = GmlxError("x" * 1_000_000)
    assert len(err.message) <= MAX_MESSAGE_CHARS + 30 and str(err) == err.message
