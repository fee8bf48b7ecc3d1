"""keep_alive and ttl on a real `gmlx serve` of SmolLM2, through the official SDKs (extra_body): a "10m" keep
outlives a 2 s idle timeout, 0 unloads after the answer without cutting another client's stream, and the
anthropic SDK's ttl does the same on /v1/messages. The same file under two ids is the control: a model no
request keeps unloads on the idle timeout."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import smollm2_path
from tests.e2e.server import LiveServer, anthropic_client, gmlx_serve, openai_client

pytestmark = pytest.mark.slow
IDLE_TIMEOUT_S = 2
CONFIG = """server:
  default_model: smollm2
  idle_timeout_s: {idle}
models:
  smollm2:
    path: {path}
  control:
    path: {path}
"""
HI: list[Any] = [{"role": "user", "content": "Say hi."}]
NO_EOS = {"2": -100}  # SmolLM2's <|im_end|>: the stream runs to max_tokens


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("keep_alive")
    config = tmp / "gmlx.yaml"
    config.write_text(CONFIG.format(idle=IDLE_TIMEOUT_S, path=smollm2_path()))
    with gmlx_serve(["--config", str(config)], tmp) as s:
        yield s


def models(s: LiveServer) -> dict[str, dict[str, Any]]:
    return {m["id"]: m for m in httpx.get(s.v1 + "/models", timeout=10).json()["data"]}


def metrics_rows(s: LiveServer) -> dict[str, dict[str, Any]]:
    rows = httpx.get(s.v1 + "/metrics", timeout=10).json()["server"]["resident_models"]
    return {r["id"]: r for r in rows}


def wait_unloaded(s: LiveServer, model: str, within_s: float) -> float:
    """Seconds until `model` is no longer resident (fails after `within_s`)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < within_s:
        if not models(s)[model]["resident"]:
            return time.monotonic() - t0
        time.sleep(0.1)
    raise AssertionError(f"{model} still resident after {within_s} s: {models(s)[model]['lifetime']}")


def test_a_ten_minute_keep_outlives_the_idle_timeout(server: LiveServer) -> None:
    client = openai_client(server)
    kept = client.chat.completions.create(model="smollm2", messages=HI, max_tokens=2,
                                          extra_body={"keep_alive": "10m"})
    client.chat.completions.create(model="control", messages=HI, max_tokens=2)
    answered = time.monotonic()
    assert kept.choices[0].message.content is not None
    lifetime = models(server)["smollm2"]["lifetime"]
    assert lifetime["source"] == "request" and lifetime["keep_alive_s"] == 600.0, lifetime
    assert 590 < lifetime["expires_in_s"] <= 600
    wait_unloaded(server, "control", 15)  # the idle timeout and the sweep are at work
    time.sleep(max(0.0, answered + 2 * IDLE_TIMEOUT_S - time.monotonic()))
    assert models(server)["smollm2"]["resident"] and "smollm2" in metrics_rows(server)
    assert metrics_rows(server)["smollm2"]["lifetime"]["keep_alive_s"] == 600.0


def test_zero_unloads_after_the_answer_never_cutting_another_stream(server: LiveServer) -> None:
    client = openai_client(server)

    def long_stream() -> tuple[str | None, int]:
        stream = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Tell me a long story."}], max_tokens=400,
            stream=True, logit_bias=NO_EOS, stream_options={"include_usage": True})
        finish, tokens = None, 0
        for chunk in stream:
            finish = next((c.finish_reason for c in chunk.choices if c.finish_reason), finish)
            tokens = chunk.usage.completion_tokens if chunk.usage else tokens
        return finish, tokens

    with ThreadPoolExecutor(1) as pool:
        other = pool.submit(long_stream)
        deadline = time.monotonic() + 60
        while not metrics_rows(server).get("smollm2", {}).get("in_flight") and time.monotonic() < deadline:
            time.sleep(0.05)
        done = client.completions.create(model="smollm2", prompt="Hello", max_tokens=2, extra_body={"keep_alive": 0})
        assert done.choices[0].text is not None
        time.sleep(3.5)  # past the handout grace and a sweep tick: an idle model would be gone by now
        assert not other.done(), "the long stream ended too soon to show anything"
        assert models(server)["smollm2"]["resident"]
        assert other.result(timeout=180) == ("length", 400)  # ran to its end, never cut
    took = wait_unloaded(server, "smollm2", 10)
    assert "smollm2" not in metrics_rows(server)
    print(f"keep_alive 0: unloaded {took:.1f} s after the other stream ended")


def test_the_responses_route_sets_it_too(server: LiveServer) -> None:
    openai_client(server).responses.create(model="smollm2", input="Say hi.", max_output_tokens=16,
                                           extra_body={"keep_alive": "1h30m"})
    assert models(server)["smollm2"]["lifetime"]["keep_alive_s"] == 5400.0


def test_the_anthropic_sdk_sets_a_ttl_and_a_ttl_of_zero_unloads(server: LiveServer) -> None:
    client = anthropic_client(server)
    client.messages.create(model="smollm2", max_tokens=2, messages=HI, extra_body={"ttl": 600})
    lifetime = metrics_rows(server)["smollm2"]["lifetime"]
    assert lifetime["source"] == "request" and lifetime["keep_alive_s"] == 600.0, lifetime
    client.messages.create(model="smollm2", max_tokens=2, messages=HI, extra_body={"ttl": 0})
    wait_unloaded(server, "smollm2", 10)
    assert "smollm2" not in metrics_rows(server)


def test_malformed_values_are_the_sdks_typed_400s(server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as oe:
        openai_client(server).chat.completions.create(model="smollm2", messages=HI, max_tokens=2,
                                                      extra_body={"keep_alive": "ten minutes"})
    assert oe.value.body["param"] == "keep_alive"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as ae:
        anthropic_client(server).messages.create(model="smollm2", max_tokens=2, messages=HI,
                                                 extra_body={"ttl": 60, "keep_alive": "1m"})
    assert "'ttl'" in ae.value.message and ae.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
