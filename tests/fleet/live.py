"""Three real `gmlx serve` hosts (the embedded SmolLM2) on fixed loopback ports, each one killed, drained
(SIGTERM) or restarted on its address, and the client-side bookkeeping of streamed chats through a proxy."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import smollm2_path
from tests.e2e.server import LiveServer, free_port, gmlx_serve

DECODE_BATCH, QUEUE_CAP = 2, 2  # small, so a burst of 8x the queue cap is 16 requests
HOST_ENV = {"GMLX_DECODE_BATCH": str(DECODE_BATCH), "GMLX_QUEUE_DEPTH_CAP": str(QUEUE_CAP),
            "GMLX_SSE_KEEPALIVE_S": "2"}
HOST_ARGS = ["--drain-timeout", "8"]  # SIGTERM: short streams finish well within it, a long one is shed
EOS_BAN = {"0": -100, "2": -100}  # SmolLM2's <|endoftext|> and <|im_end|>: a stream runs to max_tokens


class Host:
    """One `gmlx serve` on a port that survives restarts (HAProxy's config names it)."""

    def __init__(self, name: str, tmp: Path, env: dict[str, str] | None = None, disk: bool = False) -> None:
        self.name, self.tmp, self.env = name, tmp, {**HOST_ENV, **(env or {})}
        self.args = [*HOST_ARGS, "--config", str(self._disk_config())] if disk else HOST_ARGS
        self.port = free_port()
        self._cm: AbstractContextManager[LiveServer] | None = None
        self.server: LiveServer | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.starts += 1
        self._cm = gmlx_serve(self.args, self.tmp / f"{self.name}-{self.starts}", env=self.env, port=self.port)
        (self.tmp / f"{self.name}-{self.starts}").mkdir(parents=True, exist_ok=True)
        self.server = self._cm.__enter__()

    def _disk_config(self) -> Path:
        """The embedded model with the prompt cache's disk tier on, in this host's own directory (its disk)."""
        cfg = self.tmp / f"{self.name}.yaml"
        cfg.write_text(f"server:\n  prompt_cache_disk_bytes: 256MiB\n  prompt_cache_dir: {self.tmp / self.name}-pc\n"
                       f"models:\n  smollm2:\n    path: {smollm2_path()}\n")
        return cfg

    def kill(self) -> None:
        """SIGKILL: no drain, the host's connections just close."""
        assert self.server is not None
        self.server.proc.kill()
        self.stop()

    def drain(self, timeout_s: float = 120) -> int:
        """SIGTERM and wait for the exit: the graceful stop a rolling restart uses; its exit status."""
        assert self.server is not None
        self.server.proc.send_signal(signal.SIGTERM)
        rc = self.server.proc.wait(timeout_s)
        self.stop()
        return rc

    def stop(self) -> None:
        if self._cm is not None:
            self._cm.__exit__(None, None, None)
        self._cm = self.server = None

    def finished(self) -> float:
        """Requests this host's engine ran to their end (any finish reason), from its Prometheus rendering."""
        text = httpx.get(self.url + "/v1/metrics", params={"format": "prometheus"}, timeout=10).text
        return sum(s.value for f in text_string_to_metric_families(text) if f.name == "gmlx_requests_finished"
                   for s in f.samples if s.name == "gmlx_requests_finished_total")

    def metrics(self) -> dict[str, Any]:
        server: dict[str, Any] = httpx.get(self.url + "/v1/metrics", timeout=10).json()["server"]
        return server


@dataclass
class Outcome:
    """What one streamed chat through the proxy came to, as its client saw it."""

    status: int = 0
    host: str = ""
    retry_after: str | None = None
    error_type: str | None = None  # a typed error body, or an SSE error event
    chunks: int = 0  # content chunks received
    done: int = 0  # data: [DONE] lines
    transport: str | None = None  # the connection broke (exception name)

    @property
    def started(self) -> bool:
        return self.status == 200

    @property
    def completed(self) -> bool:
        return self.status == 200 and self.done == 1 and self.transport is None and self.error_type is None


def stream_chat(url: str, body: dict[str, Any], headers: dict[str, str] | None = None,
                timeout_s: float = 240, first: threading.Event | None = None) -> Outcome:
    out = Outcome()
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True},
                          headers=headers, timeout=timeout_s) as r:
            out.status, out.host = r.status_code, r.headers.get("x-gmlx-host", "").removesuffix("_spill")
            out.retry_after = r.headers.get("retry-after")
            if r.status_code != 200:
                r.read()
                out.error_type = r.json()["error"]["type"]
                return out
            for line in r.iter_lines():
                out.chunks += line.startswith("data: {") and '"content"' in line
                out.done += line == "data: [DONE]"
                if line.startswith("data: {") and '"error"' in line:
                    out.error_type = line
                if first is not None and out.chunks:
                    first.set()
    except httpx.HTTPError as e:
        out.transport = type(e).__name__
    return out


@dataclass
class Load:
    """Steady load: `workers` threads each sending one short streamed chat after another until stopped."""

    url: str
    body: dict[str, Any]
    workers: int = 2
    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Load:
        for _ in range(self.workers):
            t = threading.Thread(target=self._run, daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def _run(self) -> None:
        while not self.stop.is_set():
            self.outcomes.append(stream_chat(self.url, self.body))

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(300)


def hosts(tmp: Path, n: int = 3, disk: bool = False) -> Iterator[Host]:
    for i in range(n):
        yield Host(f"gmlx{i + 1}", tmp, disk=disk)


def start_all(hosts: list[Host]) -> None:
    """Start every host at once (each load takes seconds): returns when all are up."""
    threads = [threading.Thread(target=h.start) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(h.server is not None for h in hosts), "a host did not start"
