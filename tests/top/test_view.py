"""Formatting never fails on a snapshot with nulls or missing sections (failed probes, old servers)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gmlx_top.view import (
    Backoff,
    History,
    accept_rate,
    cache_tier,
    capacity_lines,
    expires,
    governor_text,
    memory_line,
    model_cells,
    position_cell,
    queue_line,
    rates_line,
    request_cells,
    request_summary,
    rows,
    size,
)
from tests.top.fakes import recorded

scalars = st.none() | st.booleans() | st.integers(-10**12, 10**13) | st.floats(allow_nan=False) | st.text(max_size=8)
loose = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                            max_size=4), max_leaves=12)
SECTIONS = ("concurrency", "queue", "requests", "resident_models", "governor", "memory", "capacity", "rates",
            "tokens")


@given(st.fixed_dictionaries({}, optional={name: loose for name in SECTIONS}))
def test_every_formatter_takes_any_snapshot(server: dict[str, Any]) -> None:
    queue_line(server), memory_line(server), governor_text(server), rates_line(server)
    capacity_lines(server.get("capacity"))
    request_summary(rows(server, "requests"))
    for row in rows(server, "requests"):
        request_cells(row)
    for row in rows(server, "resident_models"):
        model_cells(row)
    History(4).record(server)


def test_a_recorded_busy_row_reads_as_an_operator_expects() -> None:
    decode = recorded("busy")["server"]["requests"][-1]
    assert request_cells(decode)[1:] == ("gemma3-270m", "alice", "decode", "-", "152", "88/256", "14.9", "0.31s",
                                         "6.0s", "miss", "72%")


def test_a_prefilling_row_shows_a_progress_bar_and_its_eta() -> None:
    row = {"state": "prefill", "position": 9350, "prompt_tokens": 18700, "prefill_eta_s": 131.4}
    assert position_cell(row) == "███░░░ 50% 131.4s"
    assert position_cell({**row, "prefill_eta_s": None}) == "███░░░ 50%"  # no measured pace yet
    assert position_cell({"state": "queued", "position": 2, "prompt_tokens": 10}) == "2"
    assert position_cell({"state": "prefill", "position": None, "prompt_tokens": 10}) == "-"


def test_units_and_fallbacks() -> None:
    assert size(1536) == "1.5K" and size(98_000_000) == "93.5M" and size(None) == "-" and size(512) == "512B"
    assert accept_rate({"drafted": 10, "accepted": 4}) == "40%" and accept_rate(None) == "-"
    assert cache_tier({"tier": "block", "warm_tokens": 4096}) == "block 4096" and cache_tier({"tier": "miss"}) == "miss"
    assert capacity_lines(None) == ["no capacity table"]
    assert governor_text({})[0] == " unknown "


def test_the_rates_panel_counts_reasoning_tokens_apart() -> None:
    server = {"rates": {"prefill_tok_s_recent": 412.0}, "tokens": {"prompt": 900, "generated": 120, "reasoning": 48}}
    assert rates_line(server)[1] == "prefill recent 412.0 tok/s   generated 120, reasoning 48"
    assert rates_line({"rates": server["rates"]})[1] == "prefill recent 412.0 tok/s"  # a server without the section


def test_a_model_row_says_what_sets_its_lifetime_and_what_is_left() -> None:
    row = recorded("idle")["server"]["resident_models"][0]  # a request's keep_alive of 10m, 523.4 s left
    assert model_cells(row)[1:3] == ("keep_alive", "8m43s")
    pinned = recorded("busy")["server"]["resident_models"][0]
    assert model_cells(pinned)[1:3] == ("pinned", "never")
    assert [expires({"keep_alive_s": 60.0, "expires_in_s": s}) for s in (5400.0, 59.9, 0.0)] == ["1h30m", "59s", "0s"]
    assert expires(None) == expires({"expires_in_s": "soon"}) == "-"  # not resident, or an old server


def test_history_starts_at_zero_and_keeps_its_length() -> None:
    h = History(3)
    for rate in (1, 2.5, None, 4):
        h.record({"rates": {"decode_tok_s": rate, "prefill_tok_s_recent": 10}})
    assert list(h.decode) == [2.5, 0.0, 4.0] and list(h.prefill) == [10.0, 10.0, 10.0]


def test_backoff_doubles_to_its_cap_and_resets() -> None:
    b = Backoff(initial=0.5, maximum=3.0)
    assert [b.next() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    b.reset()
    assert b.next() == 0.5
