"""Three real `gmlx serve` hosts (the embedded SmolLM2) behind a real HAProxy with the shipped config
(deploy/haproxy): a burst, a host killed mid-burst, a rolling restart under load, prompt-cache affinity,
`gmlx top` over the three, and `gmlx plan --hosts` against what the fleet admitted. Loopback only; each
step bounded by timeouts; no timed assertions."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from gmlx_plan.cli import main as plan_main
from gmlx_top.app import TopApp
from gmlx_top.client import HttpClient
from gmlx_top.view import rows
from tests.conftest import smollm2_path
from tests.fleet.haproxy import HAPROXY, SKIP_REASON, Proxy, haproxy, hosts_of
from tests.fleet.live import DECODE_BATCH, EOS_BAN, QUEUE_CAP, Host, Load, Outcome, hosts, start_all, stream_chat
from tests.top.fakes import SIZE

pytestmark = [pytest.mark.slow, pytest.mark.skipif(HAPROXY is None, reason=SKIP_REASON)]
SHORT = {"model": "smollm2", "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 6,
         "temperature": 0}
LONG = {**SHORT, "max_tokens": 40, "logit_bias": EOS_BAN}  # runs to its cap: nothing ends during a burst
BURST = 8 * QUEUE_CAP
KEY = "X-Gmlx-Conversation"


@dataclass
class Fleet:
    hosts: list[Host]
    proxy: Proxy

    def by_name(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def finished(self) -> dict[str, float]:
        return {h.name: h.finished() for h in self.hosts}

    def settle(self) -> None:
        """Wait until every host is ready again (the last test's load may have left one marked busy)."""
        self.proxy.wait_states(lambda s: all(s[h.name] == "UP" for h in self.hosts), 60, "every host ready")


def _start(hs: list[Host]) -> None:
    start_all(hs)
    for h in hs:  # each loads its model before the fleet takes traffic
        httpx.post(h.url + "/v1/chat/completions", json=SHORT, timeout=300).raise_for_status()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    hs = list(hosts(tmp, disk=True))  # each with the prompt cache's disk tier on, in its own directory
    try:
        _start(hs)
        with haproxy(hosts_of([h.url for h in hs]), tmp, inter_ms=500) as proxy:
            yield Fleet(hs, proxy)
    finally:
        for h in hs:
            h.stop()


def _burst(url: str, body: dict[str, object], n: int) -> list[Outcome]:
    start = threading.Barrier(n)

    def one(_: int) -> Outcome:
        start.wait()
        return stream_chat(url, body)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n), timeout=600))


def test_a_burst_of_8x_the_queue_cap_completes_or_gets_typed_503s(fleet: Fleet) -> None:
    before = fleet.finished()
    outcomes = _burst(fleet.proxy.url, LONG, BURST)
    after = fleet.finished()
    spread = {name: after[name] - before[name] for name in after}
    done = [o for o in outcomes if o.completed]
    refused = [o for o in outcomes if o.status == 503]
    print(f"burst of {BURST}: {len(done)} completed, {len(refused)} refused (503); per host {spread}")
    assert len(outcomes) == BURST  # none hangs (each returned), none is lost
    assert len(done) + len(refused) == BURST, [o for o in outcomes if o not in done and o not in refused]
    assert all(o.done == 1 and o.chunks >= 1 for o in done)  # one answer each, to its end
    assert all(o.error_type == "server_overloaded" and o.retry_after and o.retry_after.isdigit() for o in refused)
    assert sum(spread.values()) == len(done)  # no request ran twice (a retried one ran on one host only)
    assert all(n >= 1 for n in spread.values()), spread  # the work spread over the three hosts
    # What the fleet admitted at once is what `gmlx plan --hosts 3` says it admits.
    out = _plan(["--hosts", "3", "--width", str(BURST), "--depth", "64", "--json"])
    assert out["fleet"]["capacity"] == 3 * (DECODE_BATCH + QUEUE_CAP)
    assert out["fleet"]["start_now"] + out["fleet"]["wait"] == len(done), (out["fleet"], len(done))
    assert out["fleet"]["refused_503"] == len(refused)


def test_gmlx_top_shows_one_row_per_host_of_the_live_fleet(fleet: Fleet) -> None:
    fleet.settle()
    app = TopApp([HttpClient(h.url) for h in fleet.hosts], interval=1.0, auto_poll=False)

    async def run() -> None:
        async with app.run_test(size=SIZE) as pilot:
            deadline = time.monotonic() + 120
            while True:  # until some host shows a stream decoding
                await app.poll_once()
                busy = [i for i, h in enumerate(app.hosts) if rows(h.server, "requests")]
                if busy or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            table = app.host_table
            cells = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
            assert [c[0] for c in cells] == [h.url.removeprefix("http://") for h in fleet.hosts]
            assert [c[1] for c in cells] == ["connected"] * 3 and all(c[2].strip() for c in cells)
            assert all(c[4].endswith(f"/{DECODE_BATCH}") for c in cells)  # in flight / decode width
            assert busy, "no host showed a running request"
            while app.selected != busy[0]:
                await pilot.press("n")
                await pilot.pause()
            assert app.request_table.row_count >= 1 and app.model_table.selected_id() == "smollm2"
            assert str(app.host_table.border_subtitle).startswith("fleet: 3/3 hosts up")

    with ThreadPoolExecutor(4) as pool:
        streams = [pool.submit(stream_chat, fleet.proxy.url, LONG) for _ in range(4)]
        asyncio.run(run())
        assert all(f.result(timeout=600).completed for f in streams)


def _home_keys(fleet: Fleet, n: int = 12) -> dict[str, str]:
    """Affinity keys and the host each one lands on."""
    homes = {}
    for i in range(n):
        key = f"conversation-{i}"
        r = httpx.post(fleet.proxy.url + "/v1/chat/completions", json=SHORT, headers={KEY: key}, timeout=300)
        assert r.status_code == 200, r.text
        homes[key] = r.headers["x-gmlx-host"].removesuffix("_spill")
    return homes


def _wait_running(host: Host, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(r.get("state") == "decode" for r in host.metrics().get("requests") or []):
        assert time.monotonic() < deadline, f"no stream decoding on {host.name}"
        time.sleep(0.1)


def test_a_host_killed_mid_burst_fails_its_streams_and_the_others_take_the_work(fleet: Fleet) -> None:
    fleet.settle()
    homes = _home_keys(fleet)
    victim = fleet.by_name("gmlx2")
    assert "gmlx2" in homes.values()
    with ThreadPoolExecutor(6) as pool:
        streams = [pool.submit(stream_chat, fleet.proxy.url, LONG) for _ in range(6)]
        _wait_running(victim, 120)
        victim.kill()
        after = [stream_chat(fleet.proxy.url, SHORT) for _ in range(6)]  # at once, before any check noticed
        outcomes = [f.result(timeout=600) for f in streams]
    on_victim = [o for o in outcomes if o.host == "gmlx2"]
    print(f"killed gmlx2: its {len(on_victim)} streams ended "
          f"{Counter(o.transport or o.error_type or 'completed' for o in on_victim)}")
    assert on_victim and all(o.started and not o.completed for o in on_victim)  # an error, not a hang
    assert all(o.transport or o.error_type for o in on_victim)
    assert all(o.completed for o in outcomes if o.host != "gmlx2")
    assert all(o.completed and o.host in ("gmlx1", "gmlx3") for o in after), after  # retried on the others
    fleet.proxy.wait_states(lambda s: s["gmlx2"] == "DOWN", 30, "gmlx2 marked down")
    victim.start()
    fleet.proxy.wait_states(lambda s: s["gmlx2"] == "UP", 60, "gmlx2 back up")
    mine = [k for k, home in homes.items() if home == "gmlx2"]
    deadline = time.monotonic() + 30  # HAProxy applies a state change a moment after its stats show it
    while _home_keys_one(fleet, mine[0]) != "gmlx2":
        assert time.monotonic() < deadline, "gmlx2 is UP but takes no work"
        time.sleep(0.2)
    assert {_home_keys_one(fleet, k) for k in mine} == {"gmlx2"}  # it rejoined: its conversations go home


def _home_keys_one(fleet: Fleet, key: str) -> str:
    r = httpx.post(fleet.proxy.url + "/v1/chat/completions", json=SHORT, headers={KEY: key}, timeout=300)
    assert r.status_code == 200, r.text
    return str(r.headers["x-gmlx-host"])


def test_a_rolling_restart_under_steady_load_loses_nothing(fleet: Fleet) -> None:
    fleet.settle()
    with Load(fleet.proxy.url, SHORT, workers=3) as load:
        for host in fleet.hosts:
            seen = len(load.outcomes)
            while len(load.outcomes) < seen + 3:  # traffic on the whole fleet before each restart
                time.sleep(0.1)
            assert host.drain() == 0  # SIGTERM: drained and exited cleanly
            host.start()
            fleet.proxy.wait_states(lambda s, name=host.name: s[name] == "UP", 60, f"{host.name} back up")
    outcomes = load.outcomes
    lost = [o for o in outcomes if not o.started]
    cut = [o for o in outcomes if o.started and not o.completed]
    print(f"rolling restart: {len(outcomes)} requests, {len(lost)} lost before streaming, {len(cut)} cut; "
          f"served by {dict(Counter(o.host for o in outcomes))}")
    assert len(outcomes) >= 9 and not lost, lost
    assert not cut, cut  # the drain let every started stream finish too


def test_a_restarted_hosts_session_comes_back_from_its_disk(fleet: Fleet) -> None:
    """A rolling restart keeps an affine session warm: its next turn after its home restarts is a disk hit."""
    fleet.settle()
    headers = {KEY: "disk-session"}
    messages = [{"role": "system", "content": "You log the lighthouse's watches. " * 40},
                {"role": "user", "content": "What happened at dawn?"}]
    first = httpx.post(fleet.proxy.url + "/v1/chat/completions", headers=headers, timeout=300,
                       json={"model": "smollm2", "messages": messages, "max_tokens": 8, "temperature": 0})
    assert first.status_code == 200, first.text
    home = fleet.by_name(first.headers["x-gmlx-host"].removesuffix("_spill"))
    assert home.drain() == 0  # SIGTERM: the queued snapshots are written before the host exits
    home.start()
    fleet.proxy.wait_states(lambda s: s[home.name] == "UP", 60, f"{home.name} back up")
    messages += [{"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "And at dusk?"}]
    again = httpx.post(fleet.proxy.url + "/v1/chat/completions", headers=headers, timeout=300,
                       json={"model": "smollm2", "messages": messages, "max_tokens": 8, "temperature": 0})
    assert again.status_code == 200 and again.headers["x-gmlx-host"].removesuffix("_spill") == home.name
    cached = again.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    stats = httpx.get(home.url + "/v1/cache/stats", timeout=10).json()["models"]["smollm2"]
    print(f"after {home.name}'s restart: {cached} of {again.json()['usage']['prompt_tokens']} tokens from disk")
    assert stats["hits"]["disk"] == 1 and stats["disk"]["restored_tokens"] == cached > 250


def _conversation(fleet: Fleet, topic: str, key: str | None) -> tuple[list[str], list[int], list[int]]:
    """Five turns; each sends the whole history. (hosts, prompt tokens, cached tokens) per turn."""
    messages: list[dict[str, str]] = [{"role": "system", "content": f"You answer questions about {topic}. " * 4}]
    hosts_, prompt, cached = [], [], []
    for turn in range(5):
        messages.append({"role": "user", "content": f"Question {turn + 1} about {topic}: tell me one more fact, "
                                                    "in a short sentence, different from the ones before."})
        r = httpx.post(fleet.proxy.url + "/v1/chat/completions", headers={KEY: key} if key else {}, timeout=300,
                       json={"model": "smollm2", "messages": messages, "max_tokens": 12, "temperature": 0})
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        hosts_.append(r.headers["x-gmlx-host"].removesuffix("_spill"))
        prompt.append(usage["prompt_tokens"])
        cached.append(usage["prompt_tokens_details"]["cached_tokens"])
        messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
    return hosts_, prompt, cached


def test_a_conversation_with_its_key_stays_on_one_host_and_hits_the_prompt_cache(fleet: Fleet) -> None:
    fleet.settle()
    keyed = _conversation(fleet, "lighthouses", "lighthouse-chat")
    keyless = _conversation(fleet, "volcanoes", None)
    rate = {name: sum(c[2]) / sum(c[1]) for name, c in (("with key", keyed), ("without", keyless))}
    for name, c in (("with key", keyed), ("without", keyless)):
        print(f"{name}: hosts {c[0]}, prompt {c[1]}, cached {c[2]}, hit rate {rate[name]:.2f}")
    assert len(set(keyed[0])) == 1  # every turn on its home
    assert all(c > 0 for c in keyed[2][1:])  # each later turn reused the conversation's prefix
    assert len(set(keyless[0])) > 1 and rate["without"] < rate["with key"]


def test_past_the_drain_deadline_a_stream_ends_with_a_typed_error(fleet: Fleet) -> None:
    fleet.settle()
    host = fleet.by_name("gmlx3")
    endless = {**LONG, "max_tokens": 4000}  # would outlast the 8 s drain deadline many times over
    first = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        stream = pool.submit(stream_chat, host.url, endless, None, 300, first)
        assert first.wait(120), "the stream produced no token"
        assert host.drain() == 0  # SIGTERM: the deadline passes, the stream is shed, the host exits
        out = stream.result(timeout=120)
    print(f"shed at the drain deadline after {out.chunks} chunks: {out.error_type}")
    assert out.started and out.transport is None and out.error_type is not None
    assert "server_overloaded_shed" in out.error_type and "shutting down" in out.error_type
    fleet.proxy.wait_states(lambda s: s["gmlx3"] == "DOWN", 30, "gmlx3 marked down")


def _plan(argv: list[str]) -> dict[str, object]:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        plan_main(["plan", "--model", str(smollm2_path()), "--decode-batch", str(DECODE_BATCH), "--queue-cap",
                   str(QUEUE_CAP), *argv])
    result: dict[str, object] = json.loads(buf.getvalue())
    return result
