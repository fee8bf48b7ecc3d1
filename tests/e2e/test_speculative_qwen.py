"""The issue's real pair over HTTP: Qwen2.5-Coder 0.5B drafting for 1.5B (same token list) gives the 1.5B's own
greedy text through the openai SDK, and the drafter's rounds show in the request's model totals."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import qwen_coder_path
from tests.e2e.server import LiveServer, gmlx_serve, openai_client

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("qwen")
    big, small = qwen_coder_path("1.5b"), qwen_coder_path("0.5b")
    (tmp / "gmlx.yaml").write_text(
        f"server:\n  decode_batch: 1\nmodels:\n  coder-small:\n    path: {small}\n"
        f"  coder:\n    path: {big}\n    draft: coder-small\n    draft_tokens: 4\n"
        f"  coder-plain:\n    path: {big}\n")
    with gmlx_serve(["--config", str(tmp / "gmlx.yaml")], tmp, timeout_s=600) as s:
        yield s


def test_the_drafted_answer_is_the_targets_own(server: LiveServer) -> None:
    oai = openai_client(server)
    msgs: Any = [{"role": "user", "content": "Write a Python function that reverses a string."}]
    spec = oai.chat.completions.create(model="coder", messages=msgs, max_tokens=32, temperature=0)
    plain = oai.chat.completions.create(model="coder-plain", messages=msgs, max_tokens=32, temperature=0)
    assert spec.choices[0].message.content == plain.choices[0].message.content
    assert "def " in (spec.choices[0].message.content or "")
    rows = httpx.get(server.v1 + "/metrics", timeout=30).json()["server"]["resident_models"]
    totals = {r["id"]: r["speculative"] for r in rows}["coder"]
    assert totals["rounds"] > 0 and 0 < totals["accepted"] <= totals["drafted"]
