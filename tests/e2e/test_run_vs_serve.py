"""`gmlx run` and `gmlx serve` answer alike: the same model, profile and prompt give the same greedy text
and finish reason, with the profile's stop strings and max_tokens applied by both, and the same refusal
of a prompt that does not fit the context window (the CLI takes the server's prompt preparation and
request builder)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.conftest import smollm2_path
from tests.e2e.server import ROOT, LiveServer, gmlx_serve, production_env

pytestmark = pytest.mark.slow
PROMPT = "List three fruits."
TERSE_CAP, SHORT_CAP = 40, 6  # terse's answer hits its stop string first; short's hits the cap


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("run-vs-serve") / "gmlx.yaml"
    path.write_text(f"""server:
  default_model: smol
models:
  smol:
    path: {smollm2_path()}
  tiny:  # a window the chat prompt alone outgrows
    path: {smollm2_path()}
    max_kv_size: 16
profiles:
  terse:
    temperature: 0
    max_tokens: {TERSE_CAP}
    stop: [":"]
  short:
    temperature: 0
    max_tokens: {SHORT_CAP}
""")
    return path


@pytest.fixture(scope="module")
def client(config: Path) -> Iterator[openai.OpenAI]:
    server: LiveServer
    with gmlx_serve(["--config", str(config)], config.parent) as server:
        yield openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)


def _cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gmlx_server.cli", "run", "--config", str(config), *args], cwd=ROOT,
                          env=production_env(), capture_output=True, text=True, timeout=300)


def _run(config: Path, *args: str) -> tuple[str, str]:
    """(the answer on stdout, the finish reason of the summary line on stderr)."""
    r = _cli(config, *args)
    assert r.returncode == 0, r.stderr
    reason = re.search(r"^\[(\w+)[]:]", r.stderr, re.MULTILINE)
    assert reason is not None, r.stderr
    return r.stdout, reason.group(1)


@pytest.mark.parametrize(("profile", "reason"), [("terse", "stop"), ("short", "length")])
def test_chat_answer_is_the_same_with_the_profile_stop_and_max_tokens(config: Path, client: openai.OpenAI,
                                                                      profile: str, reason: str) -> None:
    text, cli_reason = _run(config, f"smol@{profile}", PROMPT)
    r = client.chat.completions.create(model=f"smol@{profile}", messages=[{"role": "user", "content": PROMPT}])
    assert text == r.choices[0].message.content
    assert cli_reason == r.choices[0].finish_reason == reason
    assert r.usage is not None
    if profile == "terse":  # cut at the profile's stop string, well before its cap
        assert text and ":" not in text and r.usage.completion_tokens < TERSE_CAP
    else:
        assert r.usage.completion_tokens == SHORT_CAP


def test_raw_completion_is_the_same_with_the_profile_max_tokens(config: Path, client: openai.OpenAI) -> None:
    prompt = "The capital of France is"
    text, cli_reason = _run(config, "--profile", "short", "--raw", prompt)
    r = client.completions.create(model="smol@short", prompt=prompt)
    assert text == r.choices[0].text
    assert cli_reason == r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == SHORT_CAP


def test_a_prompt_over_the_context_window_is_refused_alike(config: Path, client: openai.OpenAI) -> None:
    r = _cli(config, "tiny", PROMPT)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPT}])
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "context_length_exceeded"
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == f"gmlx run: {error['message']}"
