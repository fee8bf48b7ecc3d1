"""The shipped HAProxy config (deploy/haproxy) in a real HAProxy in front of three fake-engine gmlx apps:
affinity by rendezvous hashing, retries of a refused request, the overflow twins, the typed 503s.

The same config in front of three real `gmlx serve` hosts is tests/fleet/test_fleet.py (slow)."""

from __future__ import annotations

import argparse
import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import pytest

from gmlx_server.app import create_app
from gmlx_server.config import RuntimeEnv
from gmlx_server.serving.model_host import ModelHost
from tests.fakes import FakeBehavior, FakeEngine, FakeFactory
from tests.fleet.haproxy import HAPROXY, SKIP_REASON, Proxy, generator, haproxy, host_of, hosts_of
from tests.routes.conftest import ThreadedServer, make_config

BODY = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
KEYS = [f"conversation-{i}" for i in range(24)]


def test_the_committed_config_is_what_the_generator_writes() -> None:
    assert generator().main(["--check"]) == 0, "run: python deploy/haproxy/generate.py > deploy/haproxy/haproxy.cfg"


@pytest.mark.skipif(HAPROXY is None, reason=SKIP_REASON)
def test_haproxy_accepts_the_committed_config() -> None:
    cfg = Path(generator().COMMITTED)
    out = subprocess.run([str(HAPROXY), "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr


def test_host_arguments() -> None:
    gen = generator()
    assert gen.parse_host("10.0.0.1:8080") == gen.Host("gmlx_10_0_0_1_8080", "10.0.0.1:8080")
    assert gen.parse_host("a=h.example:80") == gen.Host("a", "h.example:80")
    for bad in ("h.example", "a=h:port", "9a=h:80"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"expected|letters"):
            gen.parse_host(bad)


@dataclass
class Fleet:
    hosts: list[ModelHost]
    urls: list[str]

    def engine(self, i: int) -> FakeEngine:
        engine = self.hosts[i].resident["m1"]
        assert isinstance(engine, FakeEngine)
        return engine


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with ExitStack() as stack:
        hosts, urls = [], []
        for _ in range(3):
            config = make_config(env=RuntimeEnv(sse_keepalive_s=0.05, queue_depth_cap=1))
            host = ModelHost(config, FakeFactory(FakeBehavior(pieces=("x",) * 4)), check_headers=False)
            urls.append(stack.enter_context(ThreadedServer(create_app(config, host=host))))
            hosts.append(host)
        for url in urls:  # each host loads its (fake) model
            httpx.post(url + "/v1/chat/completions", json=BODY, timeout=10).raise_for_status()
        yield Fleet(hosts, urls)


def _homes(proxy: Proxy, keys: list[str]) -> dict[str, str]:
    out = {}
    for key in keys:
        r = httpx.post(proxy.url + "/v1/chat/completions", json=BODY, headers={"X-Gmlx-Conversation": key}, timeout=10)
        assert r.status_code == 200, r.text
        out[key] = host_of(r)
    return out


@pytest.mark.skipif(HAPROXY is None, reason=SKIP_REASON)
def test_affinity_is_a_consistent_hash_and_keyless_requests_spread(fleet: Fleet, tmp_path: Path) -> None:
    with haproxy(hosts_of(fleet.urls), tmp_path) as proxy:
        homes = _homes(proxy, KEYS)
        assert _homes(proxy, KEYS) == homes  # every key lands on its home again
        assert set(homes.values()) == {"gmlx1", "gmlx2", "gmlx3"}  # and the keys spread over the hosts
        keyless = Counter(host_of(httpx.post(proxy.url + "/v1/chat/completions", json=BODY, timeout=10))
                          for _ in range(6))
        assert set(keyless) == {"gmlx1", "gmlx2", "gmlx3"}  # least connections: idle hosts take turns
    two = hosts_of(fleet.urls[:2], ["gmlx1", "gmlx2"])  # gmlx3 leaves the fleet
    with haproxy(two, tmp_path) as proxy:
        after = _homes(proxy, KEYS)
    moved = {k for k in KEYS if after[k] != homes[k]}
    assert moved == {k for k in KEYS if homes[k] == "gmlx3"}  # only the leaving host's conversations move


def _home(proxy: Proxy, headers: dict[str, str] | None = None, body: dict[str, object] = BODY) -> str:
    r = httpx.post(proxy.url + "/v1/chat/completions", json=body, headers=headers or {}, timeout=10)
    assert r.status_code == 200, r.text
    return host_of(r)


@pytest.mark.skipif(HAPROXY is None, reason=SKIP_REASON)
def test_every_clients_session_header_and_prompt_cache_key_pick_the_conversations_home(
        fleet: Fleet, tmp_path: Path) -> None:
    keys = KEYS[:9]
    with haproxy(hosts_of(fleet.urls), tmp_path) as proxy:
        homes = _homes(proxy, keys)  # by X-Gmlx-Conversation
        for header in generator().KEY_HEADERS[1:]:
            assert {k: _home(proxy, {header: k}) for k in keys} == homes, header
        assert {k: _home(proxy, body={**BODY, "prompt_cache_key": k}) for k in keys} == homes
        # The chain's order: the first header set wins over later ones and over the body; empty is unset.
        other = {k: keys[(i + 1) % len(keys)] for i, k in enumerate(keys)}
        assert any(homes[other[k]] != homes[k] for k in keys)  # so a wrong pick would show
        assert {k: _home(proxy, {"X-Gmlx-Conversation": "", "X-Claude-Code-Session-Id": k,
                                 "X-Session-Id": other[k]}, {**BODY, "prompt_cache_key": other[k]})
                for k in keys} == homes


@pytest.mark.skipif(HAPROXY is None, reason=SKIP_REASON)
def test_without_any_key_the_callers_address_picks_one_home(fleet: Fleet, tmp_path: Path) -> None:
    with haproxy(hosts_of(fleet.urls), tmp_path, address_key=True) as proxy:
        assert len({_home(proxy) for _ in range(6)}) == 1  # one caller (127.0.0.1), one home
        assert set(_homes(proxy, KEYS).values()) == {"gmlx1", "gmlx2", "gmlx3"}  # keys still spread


def _claude_code(sid: str, by_header: bool) -> tuple[dict[str, str], dict[str, str]]:
    """(headers, metadata) of a Claude Code request: the session header, or what 2.1 sends a local server
    (tests/data/agents/claude-session.json): no header, the session id inside metadata.user_id's JSON."""
    if by_header:
        return {"X-Claude-Code-Session-Id": sid}, {"user_id": f"user_0_account__session_{sid}"}
    return {}, {"user_id": json.dumps({"device_id": "ca0fda8b", "account_uuid": "", "session_id": sid})}


@pytest.mark.skipif(HAPROXY is None, reason=SKIP_REASON)
@pytest.mark.parametrize("by_header", [True, False])
def test_two_interleaved_claude_code_sessions_each_stay_on_their_own_home(fleet: Fleet, tmp_path: Path,
                                                                          by_header: bool) -> None:
    """Messages through the Anthropic SDK from one address, each session told apart only by what Claude
    Code sends: the caller's-address key is on, so one home for both would mean the session was ignored."""
    with haproxy(hosts_of(fleet.urls), tmp_path, address_key=True) as proxy:
        first: dict[str, str] = {}  # two session ids whose homes differ, found by asking the proxy
        for i in range(32):
            sid = f"0b9e3c4a-{i:04d}-4f5e-9a7b-c1a0de{i:06d}"
            headers, metadata = _claude_code(sid, by_header)
            first.setdefault(_home(proxy, headers, {**BODY, "metadata": metadata}), sid)
            if len(first) == 2:
                break
        assert len(first) == 2, first  # the session is the key: 32 ids reach more than one home
        seen: dict[str, list[str]] = {sid: [] for sid in first.values()}
        for turn in range(4):
            for sid in seen:
                headers, metadata = _claude_code(sid, by_header)
                client = anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0,
                                             default_headers=headers)
                r = client.messages.with_raw_response.create(
                    model="m1", max_tokens=4, metadata=metadata,  # type: ignore[arg-type]
                    messages=[{"role": "user", "content": f"turn {turn}"}])
                seen[sid].append(host_of(r.http_response))
    assert [set(hosts) for hosts in seen.values()] == [{home} for home in first], seen


@pytest.mark.skipif(HAPROXY is None, reason=SKIP_REASON)
def test_a_refused_request_is_retried_elsewhere_and_the_last_503_reaches_the_client(
        fleet: Fleet, tmp_path: Path) -> None:
    with haproxy(hosts_of(fleet.urls), tmp_path) as proxy:
        key = KEYS[0]
        home = _homes(proxy, [key])[key]
        i = int(home[-1]) - 1
        try:
            fleet.engine(i).waiting = 5  # the home's queue is over its cap of 1: it answers 503
            r = httpx.post(proxy.url + "/v1/chat/completions", json=BODY, headers={"X-Gmlx-Conversation": key},
                           timeout=10)
            assert r.status_code == 200 and host_of(r) != home  # replayed on another host
            for n in range(3):
                fleet.engine(n).waiting = 5
            r = httpx.post(proxy.url + "/v1/messages", json=BODY, headers={"X-Gmlx-Conversation": key}, timeout=10)
            assert r.status_code == 503 and r.headers["Retry-After"].isdigit()  # a host's own refusal
            assert r.json()["type"] == "error" and r.json()["error"]["type"] == "overloaded_error", r.text
            # Every host now fails its readiness check (queue): the overflow twins take the work.
            states = proxy.wait_states(lambda s: s["gmlx1"] == s["gmlx2"] == s["gmlx3"] == "DOWN", 10, "not ready")
            assert {states[f"gmlx{n}_spill"] for n in (1, 2, 3)} == {"UP"}
            for n in range(3):
                fleet.engine(n).waiting = 0
            r = httpx.post(proxy.url + "/v1/chat/completions", json=BODY, headers={"X-Gmlx-Conversation": key},
                           timeout=10)
            assert r.status_code == 200 and r.headers["x-gmlx-host"] == home + "_spill"  # its home's twin
            proxy.wait_states(lambda s: s["gmlx1"] == s["gmlx2"] == s["gmlx3"] == "UP", 10, "ready again")
        finally:
            for n in range(3):
                fleet.engine(n).waiting = 0


@pytest.mark.skipif(HAPROXY is None, reason=SKIP_REASON)
def test_no_host_taking_work_is_a_typed_503_with_retry_after(fleet: Fleet, tmp_path: Path) -> None:
    with haproxy(hosts_of(fleet.urls), tmp_path) as proxy:
        try:
            for host in fleet.hosts:
                host.drain.begin()
            proxy.wait_states(lambda s: set(s.values()) == {"DOWN"}, 10, "all draining")
            r = httpx.post(proxy.url + "/v1/chat/completions", json=BODY, timeout=10)
            assert r.status_code == 503 and r.headers["Retry-After"] == "2"
            err = r.json()["error"]
            assert err["type"] == "server_overloaded" and err["code"] == "no_host_available"
            assert r.json()["type"] == "error"  # the same body reads as an Anthropic error
        finally:
            for host in fleet.hosts:
                host.drain.since = None
