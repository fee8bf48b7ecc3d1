"""The message orders real harnesses send, which Gemma 3's template refuses as sent ("Conversation roles must
alternate"), answered over real HTTP through the official openai SDK: Codex's Responses input (developer,
developer, user, user) and opencode's title request (system, user, user)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.conftest import gemma_path
from tests.e2e.server import LiveServer, gmlx_serve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("roles")
    cfg = tmp / "gmlx.yaml"
    cfg.write_text(f"models:\n  gemma:\n    path: {gemma_path()}\n")
    with gmlx_serve(["--config", str(cfg)], tmp) as s:
        yield s


def _client(s: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.v1, api_key="none", max_retries=0, timeout=300)


def test_codex_shaped_responses_input_is_answered(gemma: LiveServer) -> None:
    r = _client(gemma).responses.create(model="gemma", max_output_tokens=4, input=[
        {"role": "developer", "content": "You are a coding agent."}, {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "The repository is empty."}, {"role": "user", "content": "Say hello."}])
    assert r.status in ("completed", "incomplete") and r.output_text is not None
    assert "merged consecutive same-role messages" in gemma.log()  # said once, in the request's log


def test_opencode_shaped_title_request_is_answered(gemma: LiveServer) -> None:
    r = _client(gemma).chat.completions.create(model="gemma", max_tokens=4, messages=[
        {"role": "system", "content": "Write a title."}, {"role": "user", "content": "first"},
        {"role": "user", "content": "second"}])
    assert r.choices[0].finish_reason in ("stop", "length")

