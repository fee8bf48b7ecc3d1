"""Finish rules of TextStream and the thinking budget, without a model."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gmlx_server.engine.text_stream import TextStream
from gmlx_server.engine.thinking import ThinkingBudget
from gmlx_server.engine.types import ThinkingControl

EOS = 0


def _stream(pieces: list[str], stop: list[str], max_tokens: int = 100) -> TextStream:
    table = {i + 1: p for i, p in enumerate(pieces)}
    return TextStream(lambda t: table[t], lambda: "", stop, frozenset({EOS}), max_tokens)


def _run(pieces: list[str], stop: list[str], max_tokens: int = 100) -> tuple[str, str | None, str | None]:
    s = _stream(pieces, stop, max_tokens)
    out = ""
    for tok in range(1, len(pieces) + 1):
        r = s.feed(tok)
        out += r.text
        if r.finish:
            return out, r.finish, r.stop_string
    r = s.feed(EOS)
    return out + r.text, r.finish, r.stop_string


def test_stop_string_split_across_tokens_is_never_emitted() -> None:
    assert _run(["Hello", " wor", "ld", "<|e", "nd|>", "tail"], ["<|end|>"]) == ("Hello world", "stop", "<|end|>")


def test_held_back_prefix_is_released_when_it_does_not_complete() -> None:
    assert _run(["a<", "|x", "b"], ["<|end|>"]) == ("a<|xb", "stop", None)


def test_earliest_stop_wins() -> None:
    assert _run(["x STOP2 y STOP1"], ["STOP1", "STOP2"]) == ("x ", "stop", "STOP2")


def test_max_tokens_gives_length_and_flushes_held_text() -> None:
    assert _run(["a", "b", "<|e"], ["<|end|>"], max_tokens=3) == ("ab<|e", "length", None)


def test_eos_ends_with_stop_and_no_stop_string() -> None:
    assert _run(["a", "b"], []) == ("ab", "stop", None)


@given(st.lists(st.text(min_size=1, max_size=4), min_size=1, max_size=12), st.text(min_size=1, max_size=5))
def test_emitted_text_is_the_prefix_before_the_first_stop(pieces: list[str], stop: str) -> None:
    out, finish, hit = _run(pieces, [stop])
    full = "".join(pieces)
    if stop in full:
        assert (out, finish, hit) == (full[: full.index(stop)], "stop", stop)
    else:
        assert (out, finish, hit) == (full, "stop", None)


def test_thinking_budget_forces_the_close_tag_after_budget_tokens() -> None:
    close_ids = [7, 8]
    b = ThinkingBudget(ThinkingControl(budget=3), lambda s: close_ids, starts_inside=True)
    forced = []
    for _ in range(5):
        b.observe("x")
        tok = b.next_forced()
        if tok is not None:
            forced.append(tok)
    assert forced[:2] == close_ids and b.closed_by_budget


def test_thinking_budget_idle_outside_a_block_and_rearms_on_open_tag() -> None:
    b = ThinkingBudget(ThinkingControl(budget=2), lambda s: [9], starts_inside=False)
    b.observe("hello")
    assert b.next_forced() is None and not b.inside
    b.observe("<think>")
    b.observe("a")
    b.observe("b")
    assert b.inside and b.next_forced() == 9


def test_natural_close_tag_stops_counting() -> None:
    b = ThinkingBudget(ThinkingControl(budget=3), lambda s: [9], starts_inside=True)
    b.observe("a")
    b.observe("</think>")
    for _ in range(5):
        b.observe("z")
    assert b.next_forced() is None and not b.closed_by_budget
