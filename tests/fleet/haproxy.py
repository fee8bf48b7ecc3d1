"""A real HAProxy (Debian's `haproxy`, scripts/install_haproxy.sh) on free loopback ports, with the config that
deploy/haproxy/generate.py writes for the given hosts; its stats CSV says each server's check state."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

import httpx

from tests.e2e.server import ROOT, free_port
from tests.e2e.server import _stop as stop_process

HAPROXY = shutil.which("haproxy") or next((p for p in ("/usr/sbin/haproxy",) if os.access(p, os.X_OK)), None)
SKIP_REASON = "no haproxy binary: run scripts/install_haproxy.sh (as root)"


@cache
def generator() -> ModuleType:
    """deploy/haproxy/generate.py, loaded by path (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("gmlx_haproxy_generate", ROOT / "deploy" / "haproxy" / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@dataclass
class Proxy:
    url: str
    stats_url: str
    log_path: Path
    proc: subprocess.Popen[bytes]

    def states(self, backend: str = "gmlx") -> dict[str, str]:
        """server name -> UP, DOWN, MAINT... as HAProxy's checks see them now."""
        rows = httpx.get(self.stats_url + "/stats;csv", timeout=5).text.splitlines()
        cells = [r.split(",") for r in rows[1:] if r]
        return {c[1]: c[17].split(" ")[0] for c in cells if c[0] == backend and c[1] not in ("FRONTEND", "BACKEND")}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_states(self, want: Callable[[dict[str, str]], bool], timeout_s: float, what: str) -> dict[str, str]:
        deadline = time.monotonic() + timeout_s
        states = self.states()
        while not want(states):
            assert time.monotonic() < deadline, f"{what}: not after {timeout_s} s; states {states}"
            time.sleep(0.1)
            states = self.states()
        return states


def hosts_of(urls: Sequence[str], names: Sequence[str] | None = None) -> tuple[object, ...]:
    gen = generator()
    names = names or [f"gmlx{i + 1}" for i in range(len(urls))]
    return tuple(gen.Host(n, u.removeprefix("http://")) for n, u in zip(names, urls, strict=True))


@contextmanager
def haproxy(hosts: Sequence[object], tmp: Path, inter_ms: int = 300, up: bool = True,
            address_key: bool = False) -> Iterator[Proxy]:
    """HAProxy in the foreground (-db) in front of `hosts` (generate.Host); waits until every host is UP.
    Every test client is 127.0.0.1, so the caller's-address key is off unless asked: key-less requests
    stand for many callers and go by least connections."""
    assert HAPROXY, SKIP_REASON
    gen = generator()
    port, stats = free_port(), free_port()
    config = tmp / f"haproxy-{port}.cfg"
    config.write_text(gen.render(gen.Fleet(tuple(hosts), f"127.0.0.1:{port}", f"127.0.0.1:{stats}",
                                           address_key=address_key, inter_ms=inter_ms)))
    log_path = tmp / f"haproxy-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([HAPROXY, "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
    proxy = Proxy(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{stats}", log_path, proc)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"haproxy exited {proc.returncode}:\n{proxy.log()[-3000:]}"
            try:
                if not up or all(s == "UP" for s in proxy.states().values()):
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"haproxy: hosts not UP\n{proxy.log()[-3000:]}"
            time.sleep(0.1)
        yield proxy
    finally:
        stop_process(proc)  # SIGINT: HAProxy stops at once


def host_of(response: httpx.Response) -> str:
    """Which gmlx host answered (the X-Gmlx-Host header HAProxy sets), a _spill twin named as its host."""
    return response.headers.get("x-gmlx-host", "").removesuffix("_spill")
