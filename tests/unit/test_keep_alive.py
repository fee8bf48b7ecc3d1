"""keep_alive and ttl: the duration parser, the field reader every route shares, and how a request's lifetime
combines with the idle timeout, pins, keeps and memory pressure (the residency bookkeeping on a fake clock)."""

from __future__ import annotations

import math

import pytest

from gmlx_server.engine.types import Engine
from gmlx_server.errors import InvalidRequest
from gmlx_server.protocol.anthropic import parse_messages
from gmlx_server.protocol.lifetime import parse_duration
from gmlx_server.protocol.openai import parse_chat, parse_completion
from gmlx_server.protocol.params import keep_alive
from gmlx_server.protocol.responses import parse_responses
from gmlx_server.serving.residency import Residency
from tests.fakes import FakeEngine, fake_info

DURATIONS = [
    ("10m", 600.0), ("1h30m", 5400.0), ("45s", 45.0), ("1.5h", 5400.0), ("300ms", 0.3), (".5s", 0.5),
    ("1.s", 1.0), ("2h45m30.5s", 9930.5), ("1us", 1e-6), ("1µs", 1e-6), ("1μs", 1e-6), ("5ns", 5e-9),
    ("1m1ms", 60.001), ("-1m", -60.0), ("+5s", 5.0), ("0", 0.0), ("600", 600.0), ("-1", -1.0), ("0s", 0.0),
]
NOT_DURATIONS = ["", " ", "m", "10x", "1h 30m", " 10m", "ten minutes", "1.2.3s", "--1s", "1e3s", ".s", "5m-3s",
                 "1d", "10M", "inf", "nan", "1_000s"]


def test_go_durations_parse_to_seconds() -> None:
    for text, seconds in DURATIONS:
        assert parse_duration(text) == pytest.approx(seconds, rel=1e-12), text


def test_anything_else_is_not_a_duration() -> None:
    for text in NOT_DURATIONS:
        with pytest.raises(ValueError):
            parse_duration(text)


READS = [("10m", 600.0), (90, 90.0), (2.5, 2.5), (0, 0.0), ("0", 0.0), (-1, math.inf), ("-5m", math.inf),
         (-0.5, math.inf), ("30", 30.0), (1e12, 1e12)]
MALFORMED = [True, False, [], {}, "10 minutes", "", "1e400", 10**400, "9" * 400 + "h"]


@pytest.mark.parametrize("field", ["keep_alive", "ttl"])
def test_both_fields_read_seconds_and_negative_means_no_end(field: str) -> None:
    for value, seconds in READS:
        assert keep_alive({field: value}) == seconds, value


def test_absent_or_null_leaves_the_lifetime_alone() -> None:
    assert keep_alive({}) is None and keep_alive({"keep_alive": None, "ttl": None}) is None


@pytest.mark.parametrize("field", ["keep_alive", "ttl"])
def test_malformed_values_are_a_400_naming_the_field(field: str) -> None:
    for value in MALFORMED:
        with pytest.raises(InvalidRequest) as e:
            keep_alive({field: value})
        assert e.value.status == 400 and e.value.param == field and f"'{field}'" in e.value.message, value


def test_both_fields_at_once_are_a_400() -> None:
    with pytest.raises(InvalidRequest) as e:
        keep_alive({"keep_alive": "10m", "ttl": 600})
    assert e.value.param == "ttl" and "send one of them" in e.value.message


PARSERS = [
    (parse_chat, {"messages": [{"role": "user", "content": "hi"}]}),
    (parse_completion, {"prompt": "hi"}),
    (parse_messages, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    (lambda b: parse_responses(b).params, {"input": "hi"}),
]


@pytest.mark.parametrize("route", range(len(PARSERS)))
def test_every_generation_parser_carries_it(route: int) -> None:
    parse, body = PARSERS[route]
    assert parse({**body, "keep_alive": "1h"}).keep_alive_s == 3600.0
    assert parse({**body, "ttl": -1}).keep_alive_s == math.inf
    assert parse(body).keep_alive_s is None
    with pytest.raises(InvalidRequest) as e:
        parse({**body, "keep_alive": "soon"})
    assert e.value.param == "keep_alive"


# --- the combining rules ------------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Models:
    """A Residency on a fake clock over fake engines; `busy` ones report a running request."""

    def __init__(self, *ids: str, pinned: tuple[str, ...] = (), grace_s: float = 2.0) -> None:
        self.clock, self.pinned = Clock(), pinned
        self.residency = Residency(self.clock, grace_s)
        self.engines: dict[str, Engine] = {m: FakeEngine(fake_info(m)) for m in ids}
        for m in ids:
            self.residency.loaded(m, 1)

    def busy(self, model_id: str, on: bool = True) -> None:
        engine = self.engines[model_id]
        assert isinstance(engine, FakeEngine)
        engine.waiting = int(on)

    def expired(self, after_s: float, timeout_s: float = 60.0) -> list[str]:
        self.clock.t += after_s
        return self.residency.expired(self.engines, lambda m: m in self.pinned, timeout_s)

    def lifetime(self, model_id: str, timeout_s: float = 60.0) -> dict[str, object]:
        return self.residency.lifetime(model_id, self.engines[model_id].stats().waiting > 0,
                                       model_id in self.pinned, timeout_s)


def test_without_a_request_lifetime_the_idle_timeout_rules() -> None:
    m = Models("a")
    assert m.expired(59) == [] and m.expired(1) == ["a"]
    assert Models("a").expired(10**6, timeout_s=0) == []  # idle_timeout_s 0: never


def test_a_longer_keep_alive_outlives_the_idle_timeout() -> None:
    m = Models("a")
    m.residency.keep_alive("a", 600)
    assert m.expired(61) == [] and m.expired(538) == [] and m.expired(1) == ["a"]


def test_a_shorter_keep_alive_ends_before_the_idle_timeout_and_the_latest_wins() -> None:
    m = Models("a", "b")
    m.residency.keep_alive("a", 600)
    m.residency.keep_alive("a", 5)
    assert m.expired(5) == ["a"]


def test_no_end_outlives_any_idle_timeout() -> None:
    m = Models("a")
    m.residency.keep_alive("a", math.inf)
    assert m.expired(10**9) == []
    assert m.lifetime("a") == {"source": "request", "keep_alive_s": None, "expires_in_s": None}


def test_zero_unloads_once_idle_past_the_handout_grace_never_mid_stream() -> None:
    m = Models("a")
    m.residency.keep_alive("a", 0)
    assert m.expired(1) == []  # a request handed the engine may not have submitted yet
    m.busy("a")
    assert m.expired(100) == []  # another request still streams on it: never cut
    m.busy("a", False)
    assert m.expired(1) == []  # the classify above touched it: idle counts from the stream's end
    assert m.expired(1) == ["a"]


def test_pinned_and_kept_models_outlive_a_zero() -> None:
    m = Models("p", "k", pinned=("p",))
    m.residency.state("k").kept = True
    for model_id in ("p", "k"):
        m.residency.keep_alive(model_id, 0)
    assert m.expired(10**6) == []
    assert m.lifetime("p")["source"] == "pinned" and m.lifetime("k")["source"] == "kept"
    assert m.lifetime("k")["expires_in_s"] is None


def test_memory_pressure_may_still_evict_a_model_kept_with_no_end() -> None:
    m = Models("a")
    m.residency.keep_alive("a", math.inf)
    m.clock.t += 3
    assert m.residency.classify(m.engines, lambda _: False).evictable == ["a"]


def test_an_unload_forgets_the_request_lifetime() -> None:
    m = Models("a")
    m.residency.keep_alive("a", math.inf)
    m.residency.unloaded("a", explicit=False)
    m.residency.loaded("a", 1)
    assert m.lifetime("a") == {"source": "idle_timeout", "keep_alive_s": 60.0, "expires_in_s": 60.0}


def test_the_lifetime_counts_down_from_the_last_request_and_holds_while_streaming() -> None:
    m = Models("a")
    m.residency.keep_alive("a", 600)
    m.clock.t += 100
    assert m.lifetime("a") == {"source": "request", "keep_alive_s": 600.0, "expires_in_s": 500.0}
    m.busy("a")
    assert m.lifetime("a")["expires_in_s"] == 600.0
    assert m.lifetime("a", timeout_s=0) == m.lifetime("a")  # a request's lifetime beats the idle timeout


def test_the_idle_timeout_lifetime_and_zero_show_their_seconds() -> None:
    m = Models("a")
    m.clock.t += 15
    assert m.lifetime("a") == {"source": "idle_timeout", "keep_alive_s": 60.0, "expires_in_s": 45.0}
    assert m.lifetime("a", timeout_s=0)["keep_alive_s"] is None
    m.residency.keep_alive("a", 0)
    assert m.lifetime("a")["expires_in_s"] == 0.0

