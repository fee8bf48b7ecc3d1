"""The parameter table (protocol/params.py), property-tested: random subsets of its fields never give a 500,
and the one warning line names exactly the ignored ones."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gmlx_server.protocol.params import PARAMETER_TABLE, ROUTES, ignored_params
from tests.routes.conftest import Lines, Served

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
VALID: dict[str, st.SearchStrategy[Any]] = {
    "temperature": st.floats(0, 2), "top_p": st.floats(0, 1), "top_k": st.integers(-1, 100),
    "min_p": st.floats(0, 1), "max_tokens": st.integers(1, 8), "max_completion_tokens": st.integers(1, 8),
    "max_output_tokens": st.integers(1, 8), "seed": st.integers(0, 2**32), "n": st.just(1),
    "stop": st.lists(st.text(min_size=1, max_size=3), max_size=3), "logprobs": st.booleans(),
    "logit_bias": st.dictionaries(st.integers(0, 1000).map(str), st.floats(-100, 100), max_size=3),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "tool_choice": st.sampled_from(["none", "auto", "required"]), "enable_thinking": st.booleans(),
    "reasoning_effort": st.sampled_from(["none", "low", "high"]), "thinking_budget": st.integers(0, 64),
    "chat_template_kwargs": st.dictionaries(st.sampled_from(["a", "b"]), st.integers(), max_size=2),
    "profile": st.sampled_from(["coding", "chat", "nope"]), "timings_per_token": st.booleans(),
}


_CLIENTS = itertools.count()


def another_client() -> dict[str, str]:
    """Headers of a client never seen before: the warning is once an hour per client and field set."""
    return {"User-Agent": f"property-example/{next(_CLIENTS)}"}


def _value(name: str) -> st.SearchStrategy[Any]:
    return (VALID[name] | json_values) if name in VALID else json_values


bodies = st.lists(st.sampled_from(sorted(PARAMETER_TABLE)), unique=True, max_size=8).flatmap(
    lambda names: st.fixed_dictionaries({n: _value(n) for n in names}))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(["chat", "completions"]), fields=bodies)
def test_table_fields_never_500_and_warn_exactly(app_and_log: tuple[Served, Lines], route: str,
                                                 fields: dict[str, Any]) -> None:
    s, log = app_and_log
    log.lines.clear()
    base = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}
    r = s.client.post(PATHS[route], json={**base, **fields}, headers=another_client())
    assert r.status_code < 500, r.text
    expected = ignored_params(route, fields)  # type: ignore[arg-type]
    if expected:
        assert log.lines == [f"{PATHS[route]}: ignored parameters: {', '.join(expected)}"]
    else:
        assert log.lines == []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.dictionaries(st.sampled_from(["model", "messages", "prompt", "stream", "max_tokens", "x"]),
                            json_values, max_size=5))
def test_arbitrary_bodies_never_500(app_and_log: tuple[Served, Lines], body: dict[str, Any]) -> None:
    s, _ = app_and_log
    for path in PATHS.values():
        assert s.client.post(path, json=body).status_code < 500


def test_ignored_chat_parameters_named_in_one_line(app_and_log: tuple[Served, Lines]) -> None:
    s, log = app_and_log
    log.lines.clear()
    r = s.chat({"n": 2, "user": "u", "metadata": {"a": "b"}, "parallel_tool_calls": False,
                "stop_sequences": ["x"], "output_config": {}, "unknown_field": 1, "temperature": 0.5})
    assert r.status_code == 200 and len(r.json()["choices"]) == 1
    assert log.lines == ["/v1/chat/completions: ignored parameters: n, user, metadata, output_config, "
                         "stop_sequences"]


def test_table_has_a_column_per_route() -> None:
    assert all(len(row) == len(ROUTES) for row in PARAMETER_TABLE.values())
    assert PARAMETER_TABLE["max_completion_tokens"][ROUTES.index("chat")] == "honored"
    assert PARAMETER_TABLE["stop_sequences"][ROUTES.index("messages")] == "honored"
