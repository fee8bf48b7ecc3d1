"""POST /v1/completions: one string prompt, no template, its 400s."""

from __future__ import annotations

import logging

import httpx
import pytest

from tests.routes.conftest import Served, sse_events


def _complete(s: Served, **body: object) -> httpx.Response:
    return s.client.post("/v1/completions", json={"model": "m1", "prompt": "Once", **body})


def test_completion_body_uses_no_template(served: Served) -> None:
    r = _complete(served, max_tokens=2)
    body = r.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == "Hello," and body["choices"][0]["finish_reason"] == "length"
    req = served.engine().submitted[-1]
    assert list(req.prompt_tokens) == [1, *map(ord, "Once")]  # the tokenizer's BOS, the raw text
    assert served.engine().template.calls == []


def test_completion_stream_with_usage(served: Served) -> None:
    r = _complete(served, stream=True, stream_options={"include_usage": True}, stop=["world"])
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    texts = [e["choices"][0]["text"] for e in events if isinstance(e, dict) and e["choices"]]
    assert "".join(texts) == "Hello, "
    assert events[-2]["usage"]["prompt_tokens"] == 5


@pytest.mark.parametrize("body, param", [
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [1, 2, 3]}, "prompt"),
    ({"prompt": "a", "n": 2}, "n"),
    ({"prompt": "a", "echo": True}, "echo"),
    ({"prompt": "a", "suffix": "z"}, "suffix"),
    ({"prompt": "a", "best_of": 3}, "best_of"),
    ({}, "prompt"),
    ({"prompt": 5}, "prompt"),
])
def test_rejected_shapes(served: Served, body: dict[str, object], param: str) -> None:
    r = served.client.post("/v1/completions", json={"model": "m1", **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_trivial_values_of_rejected_fields_pass(served: Served) -> None:
    assert _complete(served, n=1, best_of=1, echo=False, suffix=None).status_code == 200


def test_ignored_parameters_warn_once(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gmlx.params"):
        _complete(served, logprobs=3, user="u", chat_template_kwargs={"a": 1}, temperature=0.5)
    lines = [r.getMessage() for r in caplog.records if r.name == "gmlx.params"]
    assert lines == ["/v1/completions: ignored parameters: user, logprobs, chat_template_kwargs"]
